"""What the model is and predicts: ``model_info``, ``tokenize``, ``logit_diff``, ``kl``, ``answer_rank``."""
