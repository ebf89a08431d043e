"""The ledger layer: records shared by every job on a home that the run and the driver read back.

``capacity``: the per-(provider, account, model) capacity ledger that admits provider batches into an account's
queue (conditional-write reservations, limits configured or learned from refusals).
"""
