"""The TransformerLens layer and the seam to the model: the only code that runs it.

``bridge`` names every hook and reaches into TransformerLens' ``TransformerBridge``; ``sites`` is the vocabulary of
places a value is read or written; ``forward`` runs captured forward passes; ``capabilities`` says what this
architecture supports and why not.
"""
