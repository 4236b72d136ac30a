"""Precision as a graph rewrite: the type facts (types), the float32 rules (rules), applying a plan (rewrite), the pass
(convert) and cast cleanup (casts).
"""
