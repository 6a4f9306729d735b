"""proxy.call"""
