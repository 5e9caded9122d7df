"""kvstack.router"""
