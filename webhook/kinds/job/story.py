"""How ``status`` tells a Job's story: the Job is its own one Job, its state the Job
controller's conditions (``kinds.story.job_state``)."""

from __future__ import annotations

from webhook.kinds.story import OwnJob, StoryFacts, job_state

STORY = StoryFacts(OwnJob(), state=job_state, built_in=True)
