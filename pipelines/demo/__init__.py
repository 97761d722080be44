"""The end-to-end demo on generated slides: classification (tile, embed, train, predict) and a survival study
on the same bags."""
