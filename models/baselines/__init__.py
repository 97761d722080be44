"""The MIL aggregators labs compare against, each as its authors built it, as model kinds of `wsi train`.

  transmil   TransMIL (Shao et al. 2021): Nystrom attention and PPEG over the square-padded sequence
  clam_sb    CLAM single-branch (Lu et al. 2021): gated attention + instance clustering of top/bottom tiles
  clam_mb    CLAM multi-branch: one attention branch and one bag classifier per class
  dsmil      DSMIL (Li et al. 2021): max-instance stream + distance-based attention stream
  dtfd       DTFD-MIL (Zhang et al. 2022): pseudo-bags, tier-1 attention, tier-2 on the distilled features

Our own code, written from the authors' repositories (file and commit in each docstring); the tests load
weights in the authors' layout (`from_authors_state_dict`) and match their forward, parameter count and
loss. Training quirks are the models' objectives (models.base.objectives); presets in configs/models/.
"""
