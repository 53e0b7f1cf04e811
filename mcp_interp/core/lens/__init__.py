"""Reading the residual stream and the heads of one prompt — logit lens, direct logit attribution, attention,
induction — and steering it."""
