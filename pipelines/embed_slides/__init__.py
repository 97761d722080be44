"""The slide-embedding stage: bags of tile features -> slide or patient embeddings (STAMP's layout).

embed_slides(features_dir, *, out_dir, options=SlideEmbedOptions(encoder=..., ...) | **its fields)
    -> SlideEmbedResult (one row per slide or patient; .folder: the embeddings written)
SlideEmbedOptions                 encoder, weights | random_init, level, slide_table, device, overwrite
check_bag(bag, spec, name)        refuses bags of another tile encoder / weights / tile size
write_embedding, read_embedding, EmbeddingProvenance, embedding_dir   the file format (wsi.formats)
"""

from wsi.formats.slide_embeddings import (
    Embedding,
    EmbeddingProvenance,
    embedding_dir,
    read_embedding,
    write_embedding,
)
from wsi.pipelines.embed_slides.checks import check_bag, tile_source
from wsi.pipelines.embed_slides.config import SlideEmbedOptions
from wsi.pipelines.embed_slides.run import SlideEmbedResult, embed_slides

__all__ = [
    "Embedding",
    "EmbeddingProvenance",
    "SlideEmbedOptions",
    "SlideEmbedResult",
    "check_bag",
    "embed_slides",
    "embedding_dir",
    "read_embedding",
    "tile_source",
    "write_embedding",
]
