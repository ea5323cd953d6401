"""The retry plan: what admission, ``explain``, ``status`` and the controller share.

The lower layer the mutators (``webhook.kinds``, once a folder per kind) and their readers
both import, so that peers share a vocabulary, not each other: the context and outcome of a
policy run (``outcome``), an object's resolved policy (``policies``), the record written
on it (``record``), the per-cause rules (``causes``), and the plan as typed values
(``model``); and what explain is made of, which each kind's explainer and simulator build
(``explained``, ``simulation``, and the phrases they share, ``words``)."""
