"""Data library: readers (CoNLL coreference, plain text), anonymization, vocabulary + short list,
BPE subwords, the versioned Preprocessor artifact, the synthetic entity corpus and the reader of
prepared Parquet folders.

Modules are imported directly (``from dynlm.data.readers import parse_file``); this package file
re-exports nothing so that importing one part never pulls in the others.
"""
