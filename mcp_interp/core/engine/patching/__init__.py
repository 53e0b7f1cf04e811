"""Activation patching: the exact sweep and its engines, the one patching job, its first-order estimate, the minimal
pairs it starts from and answers of several tokens as teacher-forced rows."""
