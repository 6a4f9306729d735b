"""proxy.http"""
