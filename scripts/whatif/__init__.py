"""The what-if corpus: real PyTorch programs, each with the fixes an expert would try, and the
harness that times every (program, fix) pair without a profiler and prices each pair through
profkit's step model (``analyses/whatif.md``).

    python3 scripts/whatif_accuracy.py list [--variants | --capture [--fixed] | --multirank]
    python3 scripts/whatif_accuracy.py capture-ranks OUTDIR [--programs a,b] [--budget SECONDS] [--dry-run]
    python3 scripts/whatif_accuracy.py measure OUTDIR [--programs a,b] [--fixes f,g] [--reps 3] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py interleave OUTDIR [--programs a,b] [--reps 3] [--rounds 15] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py table OUTDIR/measured.json
    python3 scripts/whatif_accuracy.py merge OUTDIR/measured.json --folder LABEL
    python3 scripts/whatif_accuracy.py page [--check]
    python3 scripts/whatif_accuracy.py replacements [--add DIR] [--check]

One module per phase, in the order the work goes:

- ``registry``: ``PROGRAMS``, what to run; the entries in ``programs_first`` and
  ``programs_models``, the pieces they share in ``builders``
- ``timing``: ``measure`` and ``interleave`` (GPU machine), and the run harness they share
- ``ranks``: ``capture-ranks``, the programs of several ranks captured one trace per rank (GPU machine)
- ``table``: a timing output printed as a table
- ``merge``: a timing output added to the committed data as run folders
- ``store``: the committed data, and which run folders give a pair's measured gain
- ``roles``: what each pair is evidence of, and which rule prices its fix
- ``pricing``: each pair priced through profkit, the page's rows
- ``page``: ``analyses/whatif.md`` from those rows (``--check``: fail when it is stale)
- ``replacements``: the replacement timings against captures of the fixed programs
  (``analyses/replacement_check.md``)
- ``cli``: the commands and their options

Everything but ``page`` and ``replacements`` imports nothing beyond the standard library (no torch, no profkit), so
it runs anywhere.
"""
