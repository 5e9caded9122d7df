"""kvstack.lora"""
