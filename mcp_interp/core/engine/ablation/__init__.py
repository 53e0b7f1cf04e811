"""Ablation: what is removed and how (``targets``), every metric before and after (``effect``), and the random
stand-ins a real effect is ranked among (``baselines``)."""
