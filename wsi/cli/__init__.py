"""Command line. Thin: parse, validate, call a keyword-only library function.

The library never imports this package.
"""
