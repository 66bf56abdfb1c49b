"""The audit's checks: each a plain DataFrame transformation, testable on its own.

Check modules take capture headers (:func:`spark_audit.load.load_headers`) or decoded facts
(:func:`spark_audit.facts.decode_facts`) and return result DataFrames; turning those into
report findings is :mod:`spark_audit.findings`' job.
"""
