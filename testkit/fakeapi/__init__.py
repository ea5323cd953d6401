"""A small Kubernetes API server for tests: list (paginated), watch (chunked JSON lines),
GET of one Job, CronJob, JobSet, TrainJob or Kubeflow Trainer runtime, list of one
namespace's pods, Jobs, LimitRanges or Events (with their field selectors), over real
HTTP, so the real ``kubernetes`` client and our caches run their real code paths. It
reproduces the documented API behaviour we rely on: ``resourceVersion`` on lists and
events, ``continue`` tokens, and Status bodies on errors. A watch starts from the
``resourceVersion`` it asks for: the events after it are sent first, then new ones, as
the watch cache does; a version older than the oldest kept (``expire`` compacts them,
as etcd does, and ends the open watches, as an API server restart does) is answered
with a watch ``ERROR`` event, code 410 Gone, after which a client must list again
(``getAllEventsSinceLocked`` and ``newErrWatcher`` in k8s.io/apiserver
pkg/storage/cacher). Resources listed and watched: Jobs, pods, LimitRanges, Nodes and
the Kubeflow Trainer runtimes. Pods also take PATCH of ``status`` (a strategic merge patch
merges ``status.conditions`` by type: ``testkit.patches``) and DELETE as the API server makes
it: ``deletionTimestamp`` while finalizers remain (a Job's pod keeps the Job controller's
until ``remove_finalizer``), gone at once without. A PATCH of a pod or a Job (not of its
status) is validated as the API server validates those updates (``testkit.apivalidation``: a pod's
``activeDeadlineSeconds`` only set or lowered, a Job's ``backoffLimit`` the one spec field
of those that changes), then admitted by ``admit_update`` (a test's validating webhook);
``modify`` is one in-process write of a listed object (the Job controller's status, the
kubelet's). A PATCH that would leave an object's annotations over 256 KiB together is 422
Invalid (``ValidateAnnotations``), and ``write_status`` fails every write of a resource,
listed ones' PATCHes too.

``GET /version`` answers the API server's ``version.Info`` (``version_info``), settable
per test (``server_version``); ``version_status`` makes it fail: an HTTP error with a
Status body, or ``VERSION_DOWN`` for a connection closed without an answer.

It also stores Secrets and mutating/validating webhook configurations (GET, POST, PUT,
PATCH), Events, Leases, and (for GET by name) JobSets and CronJobs, with the API's write
semantics: 404 ``NotFound`` for a missing object, 409
``AlreadyExists`` on create, 409 ``Conflict`` when the ``resourceVersion`` of a PUT
body or of a patched object is not the stored one (a patch that carries
``metadata.resourceVersion`` is a precondition), JSON patch (RFC 6902) and JSON merge
patch (RFC 7386), base64 decoding of ``[]byte`` fields (Secret ``data``, ``caBundle``)
with 400 on bad input, and the validation of ``kubernetes.io/tls`` Secrets, immutable
Secrets and the immutable ``type``.

``pace`` (``testkit.pacing.Paced``), when set, is called before every request is handled
but a watch's stream: an API server that answers at a given latency and serves at most a
given rate (the scale benchmarks, docs/SCALE.md)."""

from testkit.fakeapi.handler import VERSION_DOWN
from testkit.fakeapi.paths import LISTED, NAMED, TRAINER
from testkit.fakeapi.server import FakeAPI, applied, version_info, write_kubeconfig

__all__ = [
    "LISTED",
    "NAMED",
    "TRAINER",
    "VERSION_DOWN",
    "FakeAPI",
    "applied",
    "version_info",
    "write_kubeconfig",
]
