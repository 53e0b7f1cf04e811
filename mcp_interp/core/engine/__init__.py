"""What every tool family shares, grouped by concern (nothing here imports a family; every family imports from here):

* ``backend/`` — the TransformerLens layer and the seam: the only code that runs the model (``bridge``: hook names and
  reaches into the bridge; ``sites``: where a value is read or written; ``forward``: captured forward passes;
  ``capabilities``: what the architecture supports), the loaded model (``model``) and its ``loader``;
* ``patching/`` — exact activation patching (``sweep``, ``suffix_sweep``) and the one patching job over them (``job``),
  its first-order estimate (``first_order``), minimal pairs (``pairs``) and answers of several tokens (``rows``);
* ``ablation/`` — what is ablated and how (``targets``), its measured effect (``effect``) and the random stand-ins it
  is judged against (``baselines``);
* ``dictionaries/`` — SAE and transcoder weights and math (``sae``, ``saelens``, ``transcoders``,
  ``transcoder_format``);
* ``text/`` — tokenization (``tokens``), answers (``answers``), component and position names (``components``), where
  the attention sink sits (``conventions``);
* ``numbers/`` — metrics at the answer (``metrics``), the same for many patched rows (``row_readouts``), recovered
  fractions (``scores``), verdict statistics (``stats``);
* ``references`` — the one resolver of what a request names outside itself: stored directions (``direction://``), SAE
  folders, transcoder sets; it turns an ``intervention`` into the core ``Ablation``;
* ``jobs`` — the long-job contract.
"""
