"""The fingerprint component: a cheap content fingerprint of the data, so caches see changes."""

from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def fingerprint(data_uri: str) -> str:
    """The data's fingerprint (size, modification time and sampled bytes of every data file).

    Never cached: preprocess takes it as a parameter, so KFP's cache (which keys on parameters
    and artifact names, not contents) reads the data again whenever it changed.
    """
    from trainer.entry import run_guarded
    from trainer.steps.preprocess import data_fingerprint

    value = run_guarded("fingerprint", lambda: data_fingerprint(data_uri))
    print(f"data fingerprint {value} ({data_uri})", flush=True)
    return value
