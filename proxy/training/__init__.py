"""proxy.training"""
