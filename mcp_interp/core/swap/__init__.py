"""The controlled causal-swap protocol: does editing a concept's lens coordinate swap the answer?

``corpus`` (relations over concepts), ``lenses`` (logit / fitted Jacobian lens), ``controls``
(displacement-matched control tokens), ``stats`` (top-1 scoring, intervals, the exact conditional paired tests),
``trial`` (one trial), ``benchmark`` (every trial of a corpus), ``summary`` (rates and tests over
trials), ``artifact`` (the fingerprinted JSON record of a benchmark).
"""
