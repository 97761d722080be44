"""Plumbing every part of wsi shares."""
