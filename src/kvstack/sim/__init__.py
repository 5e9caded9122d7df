"""kvstack.sim"""
