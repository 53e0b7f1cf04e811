"""Activation patching: the exact sweep and its variants (sweeps), the one patching job, its first-order estimate, the minimal
pairs it starts from and answers of several tokens as teacher-forced rows."""
