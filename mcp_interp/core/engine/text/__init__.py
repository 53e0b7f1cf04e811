"""Text as every tool reads it: the tokenization rule, answers of any length, component and position names, and where
the attention sink sits."""
