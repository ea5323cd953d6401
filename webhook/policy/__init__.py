"""What users and admins write: the annotation vocabulary and its strict grammars
(``model``), and the cluster defaults and guard rails file (``config``)."""
