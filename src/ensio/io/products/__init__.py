"""What an analysis writes besides the members, the top room.

``products`` (mean and spread, copies of the prior), ``shuffleproducts``
(the same in shuffle mode), ``cf`` (CF metadata).
"""
