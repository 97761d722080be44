"""The MIL aggregators labs compare against, each as its authors built it, as model kinds of `wsi train`.

  transmil   TransMIL (Shao et al. 2021): Nystrom attention and PPEG over the square-padded sequence
  clam_sb    CLAM single-branch (Lu et al. 2021): gated attention + instance clustering of top/bottom tiles
  clam_mb    CLAM multi-branch: one attention branch and one bag classifier per class
  dsmil      DSMIL (Li et al. 2021): max-instance stream + distance-based attention stream
  dtfd       DTFD-MIL (Zhang et al. 2022): pseudo-bags, tier-1 attention, tier-2 on the distilled features

Each module is our own code, written from the authors' repository (file and commit in its docstring);
tests/models/baselines/test_mil_baselines.py loads random weights in the authors' parameter layout into ours
(`from_authors_state_dict`) and checks the forward against one written in the test from the authors'
code, the parameter count at the authors' default configuration and the authors' loss on a fixed batch.
Their training quirks are the models' own objectives (models.objectives). Presets: configs/models/
transmil.yaml, clam-sb.yaml, clam-mb.yaml, dsmil.yaml, dtfd.yaml.
"""
