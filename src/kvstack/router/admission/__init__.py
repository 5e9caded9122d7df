"""Admission: hold or shed a request before its backend is chosen (``immediate``, ``priority``)."""
