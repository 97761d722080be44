"""The core every other part stands on: errors, typed configs, users' text files, atomic file writes, the
output lock, registries, suffix tables, work bounds and progress bars. Imports nothing else of wsi."""
