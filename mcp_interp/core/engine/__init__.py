"""What every tool family shares: the one place core meets TransformerLens (``bridge``), where a value is
read or written (``sites``), forward capture (``forward``), the exact patching sweep and its engines
(``sweep``, ``suffix_sweep``) and the one patching job over them (``patching``), first-order attribution
(``attribution``), metrics read at the answer (``metrics``, ``readouts``, ``rows``), minimal pairs (``pairs``),
recovered-fraction scores (``scores``), verdict statistics (``stats``), random baselines (``baselines``),
sparse dictionaries (``dictionary``, ``saelens``), text and answers (``tokens``, ``answers``), component names
(``specs``), interventions and their measured effect (``interventions``, ``ablation``), and long jobs (``jobs``).

Nothing here imports a family; every family imports from here.
"""
