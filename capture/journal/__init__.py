"""capture.journal"""
