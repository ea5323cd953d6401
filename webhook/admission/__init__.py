"""The admission data path: decode a review, run the policy on a copy, diff for the patch,
encode the verdict (``engine.decide`` is the handler the server calls)."""
