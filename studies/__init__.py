"""Studies: experiment drivers that ask a question over many runs and print their figures.

Run from the repository root as modules (``python -m studies.rotation_many_draws``); see
README.md here for what each asks and where its result is recorded.
"""
