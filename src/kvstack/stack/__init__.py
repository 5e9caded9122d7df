"""kvstack.stack"""
