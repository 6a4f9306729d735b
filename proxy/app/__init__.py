"""proxy.app"""
