"""What every launcher of a custom resource has (a PyTorchJob's, a TrainJob's, a Katib
Experiment's): its namespace, its own pod, the API, how often it looks and what it does on exit;
each run it makes goes through a :class:`~trainer.launch.watch.Watch` with those settings."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Self

from trainer.launch.kube import KubeApi
from trainer.launch.owners import PodRef
from trainer.launch.watch import OnExit, Resource, Watch

log = logging.getLogger(__name__)


class ResourceLauncher:
    """What every launcher of a custom resource has: namespace, own pod, API, poll, on_exit.

    Args:
        namespace: namespace of the object (the launcher pod's, for the ownerReference).
        api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig, on first use.
        own_pod: the launcher's pod; the object gets an ownerReference to it when it is in the
            same namespace, so deleting the run's pods deletes the object.
        poll_s: seconds between looks at the object.
        on_exit: what to do with the object on failure, deadline and cancellation.

    Raises:
        ValueError: an argument is out of range.
    """

    on_exit_choices: tuple[str, ...] = ("delete", "keep", "suspend")

    def __init__(
        self,
        *,
        namespace: str,
        api: KubeApi | None,
        own_pod: PodRef | None,
        poll_s: float,
        on_exit: OnExit,
    ) -> None:
        if not namespace:
            raise ValueError("namespace must be set, got ''")
        if on_exit not in self.on_exit_choices:
            raise ValueError(
                f"on_exit must be {', '.join(self.on_exit_choices[:-1])} or "
                f"{self.on_exit_choices[-1]}, got {on_exit!r}"
            )
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        if own_pod is not None and own_pod.namespace != namespace:
            # Owner references cannot cross namespaces: the garbage collector would delete the
            # object at once, believing its owner gone.
            log.warning(
                "launcher pod %s/%s is not in the namespace %s: no ownerReference",
                own_pod.namespace,
                own_pod.name,
                namespace,
            )
            own_pod = None
        self.namespace = namespace
        self.own_pod = own_pod
        self.poll_s = poll_s
        self.on_exit: OnExit = on_exit
        self._api = api

    @classmethod
    def from_environment(
        cls, *, namespace: str | None = None, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> Self:
        """A launcher that knows its own pod from the downward API (POD_NAME, POD_NAMESPACE,
        POD_UID), creating its objects in the pod's namespace unless ``namespace`` is given.

        Raises:
            ValueError: no namespace given and POD_NAMESPACE is unset.
        """
        env = os.environ if env is None else env
        namespace = namespace or env.get("POD_NAMESPACE")
        if not namespace:
            raise ValueError("namespace must be given or POD_NAMESPACE set (downward API)")
        return cls(namespace=namespace, own_pod=PodRef.from_env(env), **kwargs)

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi.from_config()
        return self._api

    def watch(
        self,
        resource: Resource,
        name: str,
        timeout_s: float | None,
        report: Callable[[str], None] | None = None,
    ) -> Watch:
        """A :class:`Watch` of the object ``name`` with this launcher's settings, its progress
        lines to ``report`` (default: the watch loop's log)."""
        return Watch(
            self.api,
            resource,
            namespace=self.namespace,
            name=name,
            timeout_s=timeout_s,
            poll_s=self.poll_s,
            on_exit=self.on_exit,
            own_pod=self.own_pod,
            report=report,
        )
