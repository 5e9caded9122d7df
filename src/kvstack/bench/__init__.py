"""kvstack.bench"""
