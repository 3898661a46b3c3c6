"""`collbench import nccl-tests|osu FILE...`: outputs of runs made elsewhere as result records.

    convert.py   nccl-tests / rccl-tests (text, -J, -Z json|csv) and OSU outputs -> records
    cli.py       the verb: a summary per run found, the records appended to --results

(`import` is a Python keyword, hence the package name.)
"""
