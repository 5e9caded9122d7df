"""kvstack.index"""
