"""Every code of the one-line contract (``ERROR [<step>] E_...``, ``WARNING ... W_...``,
``NOTE ... I_...``) with its cause and its fix: the one table the documentation's error page is
generated from (``pipelines/reference.py``).

A code used anywhere in ``trainer/``, ``components/`` or ``pipelines/`` and missing here, or
here with no text, fails ``tests/unit/test_codes.py``. The table describes; it decides nothing
at run time (exit codes are chosen where each error is raised, and the test checks that they
agree with :data:`trainer.base.errors.NOT_INPUT_CODES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["error", "warning", "note"]


@dataclass(frozen=True, slots=True)
class Code:
    """What one code means and what a person does about it."""

    exit_code: int | None
    """The exit code of the command or step that prints it (``None``: a warning or a note; the
    run goes on)."""
    cause: str
    """What went wrong, or what was decided (Markdown, one paragraph)."""
    fix: str
    """What to do about it (Markdown, one paragraph)."""

    def kind(self, code: str) -> Kind:
        """``error``, ``warning`` or ``note``, from the code's first letter."""
        if code.startswith("W_"):
            return "warning"
        return "note" if code.startswith("I_") else "error"


_BAD = 2  # the person's input: permanent, never retried by the operator's ExitCode policy
_SYSTEM = 1  # a system outside the input, or a run that cannot go on

CODES: dict[str, Code] = {
    # -- parameters, flags and configs ----------------------------------------------------------
    "E_PARAM": Code(
        _BAD,
        "A pipeline parameter or a command-line flag is wrong: an unknown name (the nearest "
        "known names are suggested), a value of the wrong type or out of range, a key of a "
        "`*_json` parameter that no config has, or a flag that belongs to the other kind of run "
        "(`--root` with `--host`, `--wait` with `--local`), a `--host` with more than "
        "`http(s)://host[:port][/path]` (user info, a backslash, a query ...), a `--ca-cert` "
        "that is not PEM, or a secret in a parameter that KFP would store (keys in `data_uri`, "
        'a secret-named variable of the job\'s environment, a `"password"` in a JSON '
        "parameter). Checked before any step runs or any request is sent. In a pipeline of "
        "your own: `preprocess` or `fingerprint` given both of their table inputs (the "
        "Dataset artifact `data` and `data_uri`) or neither.",
        "Correct the parameter or flag the message names. `gpupipe run --help` lists every "
        "parameter with its type and default; the [parameter reference](parameters.md) says "
        "what each does. A secret goes in a Kubernetes Secret the steps read through "
        "`secretKeyRef` (`object_store_secret`, `registry_secret`), never in a parameter.",
    ),
    "E_CONFIG": Code(
        _BAD,
        "A config has an unknown key or a value its field does not accept: the worker's JSON "
        "config (`python -m trainer.worker --config`), a `--set` override, the keys inside "
        "`hyperparams_json`, `train_config_json` or `tune_space_json`, a config file that does "
        "not exist, or a metrics port that cannot be served.",
        "Fix the field the message names (`train.epochs`, `optim.lr` ...); the "
        "[config reference](config.md) lists every field with its default and what it does. A "
        "misspelt key names the nearest known ones.",
    ),
    "E_INVALID": Code(
        _BAD,
        "Bad input that no more specific code covers: a value the step cannot use, raised "
        "where the input was read.",
        "Read the message: it names the value and where it came from (a field, a file, a "
        "column). Correct it and run again.",
    ),
    # -- the data -----------------------------------------------------------------------------
    "E_DATA": Code(
        _BAD,
        "The data cannot be read as a table: no file or folder at `data_uri`, a folder with no "
        "`.parquet` files, a file that is not what its name says (a `.parquet` file that is "
        "text), or a Parquet file that cannot be decoded; a Dataset artifact given as "
        "`preprocess`'s `data` that the upstream step did not write, or that is neither "
        "Parquet nor CSV text (a pickle, a NumPy array).",
        "Check `data_uri` (`--data`): a local path, `s3://`, `gs://` or `minio://` to a Parquet "
        "or CSV file, or a folder of Parquet files. The message names the file. An upstream "
        "step writes its Dataset as Parquet or CSV (`df.to_parquet(table.path)`), or a folder "
        "of `.parquet`/`.csv` files.",
    ),
    "E_DATA_CHANGED": Code(
        _BAD,
        "The data changed after the run began: preprocess found a different fingerprint from "
        "the one the `fingerprint` step took, so a cached result would not hold what its key "
        "says.",
        "Run the pipeline again once the data has stopped changing (write new data under a "
        "new name, then point `data_uri` at it).",
    ),
    "E_CSV": Code(
        _BAD,
        "A CSV line does not parse: it has more or fewer fields than the header, usually "
        "because the delimiter or the header setting is wrong, or a quote is not closed.",
        "The message shows the line and a hint. Set `csv_delimiter` (a character, `tab` or "
        "`auto`), `csv_header=false` for a file without a header line, or repair the line.",
    ),
    "E_ENCODING": Code(
        _BAD,
        "A CSV file is not valid text in `csv_encoding` (default `utf-8`): the message names "
        "the byte and the line.",
        "Set the file's encoding, e.g. `--param csv_encoding=latin-1`, or re-save the file as "
        "UTF-8.",
    ),
    "E_EMPTY": Code(
        _BAD,
        "The dataset has no rows (only a header, or an empty file).",
        "Point `data_uri` at the table with the rows.",
    ),
    "E_COLUMN": Code(
        _BAD,
        "The target column named for preprocess is not in the data (`python -m trainer "
        "preprocess --set target=...`).",
        "Name a column the data has; the message lists them.",
    ),
    "E_TARGET": Code(
        _BAD,
        "The target column cannot be learned: it is not in the data, has missing or NaN "
        "values, holds one value in every row (regression), has a type other than numbers or "
        "text, is text for a regression, or holds numbers written as text that would make one "
        "class per number.",
        "Pick another `target`, fill or remove the rows without a target, set `task` "
        "(`classification` when numbers are labels), or `csv_decimal=,` when the numbers use "
        "a decimal comma. The message says which case it is.",
    ),
    "E_SCHEMA": Code(
        _BAD,
        "The columns do not fit together: a column name appears twice, Parquet files of one "
        "dataset disagree on a column's type, a column declared `numeric` holds text or one "
        "declared `date` holds no dates, two features would get the same name (a categorical "
        "column's `<column>=<value>` features against another column), a split lacks a column "
        "the model needs, or the target holds a class the model does not know.",
        "Rename or fix the columns the message names, make the files agree, or change the "
        "role in `column_roles_json`.",
    ),
    "E_MIXED_TYPES": Code(
        _BAD,
        "A column mixes numbers and text: most values are numbers, some are words (`n/a`, "
        "`unknown`, a typo).",
        "Fix the value, declare the column `categorical` in `column_roles_json`, or list the "
        "placeholders as missing with `csv_null_values` (`?,-,unknown`).",
    ),
    "E_ALL_MISSING": Code(
        _BAD,
        "A column has no values at all, or none in the training split (so nothing can be "
        "learned or imputed from it).",
        'Fill the column, drop it with `column_roles_json` (`{"col": "drop"}`), or split '
        "differently (`seed`, `preprocess_config_json`).",
    ),
    "E_INFINITE": Code(
        _BAD,
        "A numeric column holds an infinite value; the message names the row.",
        "Fix the value (or make it missing), or drop the column with `column_roles_json`.",
    ),
    "E_OVERFLOW": Code(
        _BAD,
        "A value lies beyond the float32 range that training computes in, or overflows it once "
        "standardised with the training split's mean and standard deviation.",
        "Rescale the column (store thousands, or a log), fix the value, or drop the column "
        "with `column_roles_json`.",
    ),
    "E_SPLIT": Code(
        _BAD,
        "Preprocess cannot make the training, validation and test splits: `val_fraction` and "
        "`test_fraction` leave no training rows, a class has all its rows in the held-out "
        "splits, or the target has more classes than its rows can spread over the splits.",
        "Add rows, remove the rare classes, or lower the held-out shares with "
        '`preprocess_config_json` (`{"val_fraction": 0.1, "test_fraction": 0.1}`).',
    ),
    # -- models, outputs and places -----------------------------------------------------------
    "E_MODEL": Code(
        _BAD,
        "A model artifact cannot be used: its folder is missing or incomplete, it names a "
        "plugin (`package.module:build`) the step is not allowed to import, its task does "
        "not match what the step scores, or the registry's champion is larger than "
        "`max_champion_bytes` (its listing, a file's length, or the bytes counted as they "
        "came; nothing of the download is left).",
        "Point the step at a model folder a train step wrote; allow a plugin in the step's "
        "`model_plugins` (it is then imported from the installed environment, never from the "
        "artifact); check the registry's champion, or raise the pipeline parameter "
        "`max_champion_bytes`.",
    ),
    "E_OUTPUT": Code(
        _BAD,
        "An output location holds something gpupipe did not write: a file or folder of other "
        "files, the input itself (`--output .`, an output inside the input), or a checkpoint "
        "folder that is not the checkpoint manager's. Nothing was touched.",
        "Write to a new or empty location, or to one this same step wrote before (it carries "
        "a `.gpupipe-output.json` marker).",
    ),
    "E_ROOT": Code(
        _BAD,
        "`gpupipe run --local --root` is a file, cannot be read, or is a folder of files "
        "gpupipe did not create (it has no `.gpupipe-root.json` marker).",
        "Pass a new or empty folder, or a root an earlier `gpupipe run --local` created.",
    ),
    "E_PATH": Code(
        _BAD,
        "A path flag points at the wrong kind of thing (a file where a folder is needed), or "
        "the path cannot be read or written (permission denied).",
        "Pass a folder where one is asked for, and a place you may write to.",
    ),
    "E_URI": Code(
        _BAD,
        "A storage URI is refused: credentials written inside an `s3://` or `gs://` URI, or an "
        "object key with `.` or `..` segments.",
        "Remove the credentials from the URI and set them in the environment (the message "
        "names the variables); write the key without `.` and `..`.",
    ),
    "E_REGISTRY": Code(
        _BAD,
        "The model registry at `registry_uri` cannot be used: a server that does not answer "
        "within `--registry-timeout` seconds or is not an MLflow tracking server, or a SQLite "
        "path that is not a file, not a database, or a database MLflow did not create.",
        "Check `registry_uri` and that the server runs (or raise `--registry-timeout`); for the "
        "embedded registry name a new file. gpupipe never migrates a database it did not "
        "create.",
    ),
    # -- running the steps in images --------------------------------------------------------------
    "E_IMAGE": Code(
        _BAD,
        "`--runner docker`: a step's image is not in the local Docker engine.",
        "`make images`, pull the image, or map it to one you have with `--image-override "
        "ORIGINAL=REPLACEMENT`.",
    ),
    "E_DOCKER": Code(
        _BAD,
        "`--runner docker`: the `docker` Python package is missing or no Docker engine answers.",
        "Start a Docker engine (`hack/docker-up.sh` starts one as root) and install the dev "
        "dependencies (`make setup`).",
    ),
    # -- cluster jobs ---------------------------------------------------------------------------
    "E_POD_SECURITY": Code(
        _BAD,
        "The namespace's Pod Security admission refuses a pod of the training job, e.g. the "
        "Training Operator's init container (no securityContext) in a namespace that enforces "
        "`restricted`. The launcher fails the job at once instead of letting the operator retry "
        "forever.",
        "Give the operator an init-container template with the restricted fields "
        "(`--pytorch-init-container-template-file`, as `hack/cluster/addons/"
        "training-operator.sh` does), or run in a namespace at `baseline`. See "
        "[On a cluster](../cluster.md).",
    ),
    "E_JOB_REFUSED": Code(
        _BAD,
        "An admission webhook denies what the job's controller creates (a TrainJob's runtime "
        "patch, a JobSet, a pod spec): no retry of the controller can change that.",
        "Read the webhook's message in the error. Where a policy refuses TrainJob runtime "
        'patches, set `train_config_json={"cluster.runtime_patches": false}` and put those '
        "settings in the runtime.",
    ),
    "E_NO_GPU_NODE": Code(
        _BAD,
        "A training job's pods ask more GPUs each (`gpus_per_node` of `gpu_type`) than any node "
        "with the job's node selector has allocatable, so they could never be scheduled: the "
        "launcher reads the nodes before it creates the job and refuses it, rather than waiting "
        "for the step's deadline.",
        "Ask fewer GPUs per node (and more nodes), or name the resource and node selector your "
        "GPU nodes have (`gpu_type`, `gpu_node_selector`). Where a cluster autoscaler adds GPU "
        'nodes only when pods ask for them, set `train_config_json={"cluster.gpu_node_check": '
        "false}`.",
    ),
    "E_QUEUE_REFUSED": Code(
        _BAD,
        "Kueue says the job can never be admitted in its queue (`gang_queue`): its pods together "
        "ask more than the ClusterQueue's whole quota (Kueue's words: `> maximum capacity`), or "
        "the LocalQueue does not exist in the job's namespace. It would wait for ever, so the "
        "step deletes it and fails.",
        "Ask less (fewer nodes or GPUs, smaller requests), raise the ClusterQueue's quota, or "
        "name a LocalQueue of the job's namespace (`kubectl get localqueues -n <namespace>`).",
    ),
    "E_NO_CUDA": Code(
        _BAD,
        "A training pod holds GPUs (its `nvidia.com/gpu` limit: the launcher sets "
        "`GPUPIPE_GPUS_PER_NODE` in its environment) but torch finds no CUDA device: a CPU-only "
        "image (the CPU image under the CUDA image's name, a CPU build of torch), or a node whose "
        "GPU driver or container toolkit is missing. Training on the CPU there would hold the "
        "GPUs and take hours unnoticed, so the worker refuses before it starts.",
        "Run the CUDA image (`cuda_image`), and check the node's driver (`nvidia-smi` in a pod "
        "on it). To train on the CPU in such a pod on purpose (a test cluster whose GPUs are a "
        'device plugin\'s alone), set `job_env={"GPUPIPE_ALLOW_NO_CUDA": "1"}`.',
    ),
    # -- KFP ------------------------------------------------------------------------------------
    "E_HOST": Code(
        _BAD,
        "`--host` does not start with `http://` or `https://`.",
        "Pass the KFP endpoint as a URL, e.g. `http://localhost:8080` through a port-forward.",
    ),
    "E_INSECURE": Code(
        _BAD,
        "A bearer token would be sent over plain `http://` to a host other than this machine; "
        "refused before any request, because a warning is read after the token has crossed "
        "the network.",
        "Use `https://`, a port-forward to `localhost`, or `--insecure` when the network "
        "between is yours.",
    ),
    "E_AUTH": Code(
        _BAD,
        "KFP answered 401 (no token or a token it does not accept), or the token file named by "
        "`KF_PIPELINES_SA_TOKEN_PATH` does not exist.",
        "Pass a token: `--token`, or a file in `KF_PIPELINES_SA_TOKEN_PATH` (e.g. `kubectl -n "
        "<profile> create token default-editor --audience=pipelines.kubeflow.org`). See "
        "[On KFP](../kfp.md#authentication-and-namespaces).",
    ),
    "E_FORBIDDEN": Code(
        _BAD,
        "KFP answered 403: the token's identity may not act in that namespace.",
        "Ask the namespace's owner to add you as a contributor, or pass `--namespace` of a "
        "profile you can edit.",
    ),
    "E_NOT_FOUND": Code(
        _BAD,
        "The pipeline, version, run or recurring run named does not exist on that KFP (404, or "
        "no schedule of that `--name`).",
        "`gpupipe upload` first; check `--pipeline`, `--version` and `--namespace`; `gpupipe "
        "schedule --list` shows the schedules.",
    ),
    "E_CONFLICT": Code(
        _BAD,
        "A version of that name already exists with different content, or KFP answered 409.",
        "Pick another `--version`, or leave it out: the default name is the content's hash.",
    ),
    "E_REJECTED": Code(
        _BAD,
        "KFP refused a request with another 4xx status (a broken pipeline YAML, a bad "
        "argument); the API server's own reason is in the message.",
        "Fix what the reason names; for an uploaded YAML, recompile with `gpupipe compile`.",
    ),
    "E_PACKAGE": Code(
        _BAD,
        "`gpupipe upload --package FILE` cannot read the file as YAML, or it holds no YAML "
        "mapping.",
        "Pass a pipeline YAML written by `gpupipe compile`, or leave `--package` out to upload "
        "the training pipeline compiled now.",
    ),
    "E_CRON": Code(
        _BAD,
        "The schedule's cron is missing or malformed; it has six fields, `second minute hour "
        "day-of-month month day-of-week`, in UTC. The message names the field.",
        'Write six fields, e.g. `--cron "0 0 2 * * *"` for 02:00 UTC every day.',
    ),
    "E_TIME": Code(
        _BAD,
        "`--start` or `--end` is not an ISO 8601 time, or `--end` is not after `--start`.",
        "Write times like `2026-12-01T02:00:00Z` (UTC when no zone is given).",
    ),
    # -- failures that are not the input (exit 1) -----------------------------------------------
    "E_TRAIN": Code(
        _SYSTEM,
        "The training run cannot go on: the NaN/Inf rollbacks (`train.max_nan_rollbacks`) or "
        "the out-of-memory fallbacks (down to `train.min_micro_batch_size`) are used up, or "
        "the training code failed. Permanent (exit 1).",
        "Read the job's log (the traceback is there). Lower `learning_rate`, give the job more "
        "memory or GPUs, or shrink the model.",
    ),
    "E_STALE_ATTEMPT": Code(
        _SYSTEM,
        "A training process of an earlier attempt of the job (frozen, cut off from the network, "
        "on a node that was lost and came back) woke up after a newer attempt had taken over "
        "its checkpoint folder: it stopped before writing, pruning, deleting or exporting "
        "anything (its checkpoints are fenced by the attempt records under "
        "`<checkpoints>/attempts/`). The worker exits 200, which the operators retry; the step "
        "that reads the line fails like any other system failure (exit 1).",
        "Nothing: the newer attempt's checkpoints and model stand. If it repeats, look for two "
        "jobs or runs writing the same `work_uri`.",
    ),
    "E_EXTERNAL": Code(
        _SYSTEM,
        "A system outside the input failed: the registry, an object store, the Kubernetes API, "
        "a training job that failed or ran past its deadline. Retried where a retry pays "
        "(train, tune, register).",
        "The message names the resource (`namespace/name`, the URI); check that system and run "
        "again.",
    ),
    "E_STOPPED": Code(
        _SYSTEM,
        "A train or tune step that launches a cluster job (a PyTorchJob, a TrainJob, a Katib "
        "Experiment) was stopped while the job ran: its KFP run was terminated, stopped or "
        "deleted, or its pod was sent SIGTERM. The step applied its `on_exit` (deleting the "
        "job by default) and says so; nothing in the job failed.",
        "Nothing, if the run was stopped on purpose; otherwise start it again. The message "
        "says what became of the job (`on_exit`: deleted, kept for inspection, or suspended). "
        "A pod deleted while its run goes on leaves the job running for KFP's retry, which "
        "re-attaches to it.",
    ),
    "E_FAILED": Code(
        _SYSTEM,
        "A step of `gpupipe run --local` failed without printing its own error line (it "
        "crashed); the last exception of its log is quoted.",
        "Read the step's log: the run's `run.log`, whose path the summary prints (`-v` "
        "prints it above the summary too); a traceback there is a bug worth an issue.",
    ),
    "E_INTERNAL": Code(
        _SYSTEM,
        "A child process reported an internal failure; launchers treat it as not the input's "
        "fault (exit 1, never 2).",
        "Read the step's log; it is a bug worth an issue with that log.",
    ),
    "E_DISK_FULL": Code(
        _SYSTEM,
        "A write found its filesystem full (or over quota); the half-written files were "
        "removed. The message names the filesystem and how much is free.",
        "Free space there (or point `--root`, the checkpoint or output location elsewhere) "
        "and run again.",
    ),
    "E_UNREACHABLE": Code(
        _SYSTEM,
        "KFP does not answer at `--host` (connection refused, a name that does not resolve, a "
        "TLS certificate it cannot verify), or a request got no answer within its timeout (10 s "
        "to connect, 60 s to answer: a port-forward that accepts and then stalls).",
        "Start the port-forward (`kubectl -n kubeflow port-forward svc/ml-pipeline-ui "
        "8080:80`) or check the URL.",
    ),
    "E_SERVER": Code(
        _SYSTEM,
        "KFP answered with a 5xx status three times, with backoff between the tries; or a "
        "listing did not end: the server handed back a page token it had given before, or more "
        "than 1000 pages.",
        "Look at the API server's log (`kubectl -n kubeflow logs deploy/ml-pipeline`) and try "
        "again.",
    ),
    "E_TIMEOUT": Code(
        _SYSTEM,
        "`gpupipe run --host --wait` waited `--timeout` seconds (default 6 h), or KFP did not "
        "answer before they were up (every request gets no more than the time left); the run "
        "keeps running.",
        "Follow it in the UI (the message has its link), or wait longer with `--timeout`.",
    ),
    "E_MODE": Code(
        _SYSTEM,
        "KFP accepted `gpupipe schedule --enable` (or `--disable`) but still reads the recurring "
        "run's old mode a minute later; its persistence agent copies the ScheduledWorkflow back "
        "into KFP's table and has not caught up.",
        "Check the recurring run's page (the message has its link) and the persistence agent's "
        "log (`kubectl -n kubeflow logs deploy/ml-pipeline-persistenceagent`); run the command "
        "again.",
    ),
    "E_RUN_FAILED": Code(
        _SYSTEM,
        "`gpupipe run --host --wait`: the run failed; the message names the failed step with "
        "its own error line when KFP archived its log.",
        "Look up the step's own code on this page; the run's link opens its graph and logs.",
    ),
    "E_RUN_CANCELED": Code(
        _SYSTEM,
        "`gpupipe run --host --wait`: the run was cancelled (terminated in the UI or by the API).",
        "Start it again if it should have finished.",
    ),
    "E_RUN_SKIPPED": Code(
        _SYSTEM,
        "`gpupipe run --host --wait`: KFP reports the run as skipped.",
        "Open the run's link in the UI to see why, and start it again.",
    ),
    "E_INTERRUPTED": Code(
        130,
        "Ctrl-C or SIGTERM stopped `gpupipe run --local`: every step process was stopped, "
        "training after writing a checkpoint.",
        "Run the same command again: training resumes from the newest complete checkpoint "
        "(`--json` lists them).",
    ),
    # -- warnings (the run goes on) -------------------------------------------------------------
    "W_IDENTIFIER": Code(
        None,
        "A column looks like an identifier (text unique per row, or whole numbers unique per "
        "row whose name says key, such as `customer_id`, or that are nearly consecutive) and "
        "is left out of the features.",
        "Nothing, if it is an identifier. To use it, declare its role `keep` (or `numeric`, "
        "`categorical`) in `column_roles_json`.",
    ),
    "W_CONSTANT": Code(
        None,
        "A column holds one value in every row and is left out of the features.",
        "Nothing; `keep` in `column_roles_json` keeps it anyway.",
    ),
    "W_LEAKAGE": Code(
        None,
        "A column predicts the target perfectly on its own (identical to it, an exact linear "
        "function of it, thresholds that separate every class, or values that each have one "
        "class). It is kept: you decide.",
        "If the column is known only after the outcome, it is leakage and the model will not "
        "work on new data: drop it with `column_roles_json`.",
    ),
    "W_DECIMAL": Code(
        None,
        "A text column holds numbers written with the other decimal separator (`26,9`); read "
        "as text it becomes a category with one value per number.",
        "`--param csv_decimal=,` reads them as numbers.",
    ),
    "W_TARGET": Code(
        None,
        "With `task=classification`, a target of numbers written as text (or with the other "
        "decimal separator) becomes one class per distinct value.",
        "Nothing, if they are labels; otherwise `csv_decimal=,` or `task=regression`.",
    ),
    "W_TASK": Code(
        None,
        "A numeric target has few distinct values that are not all whole numbers (`0.5`, "
        "`1.5`): it is read as a regression.",
        "If the values are labels, set `task=classification`.",
    ),
    "W_LABELS": Code(
        None,
        "Target labels differ only in surrounding spaces or in case (`yes` and `yes `, as "
        "hand-edited exports have): each is a class of its own, and the model is split across "
        "them.",
        "If they mean one class, strip the spaces and use one spelling in the data, then run "
        "again.",
    ),
    "W_TEST_SPLIT": Code(
        None,
        "The test split will have fewer than 30 rows: the model is trained and scored but not "
        "gated, and nothing is registered.",
        "Add rows, or raise `test_fraction` with `preprocess_config_json`.",
    ),
    # -- notes --------------------------------------------------------------------------------
    "I_TASK": Code(
        None,
        "What preprocess will decide about the task before any step runs, and why (text "
        "labels, a few whole numbers, the `task` parameter).",
        "Nothing; set `task` if the decision is wrong.",
    ),
    "I_DATE": Code(
        None,
        "A column holds dates (Parquet dates and timestamps, or text such as `2024-01-31` or "
        "`31.01.2024`); the note names the numbers it becomes (`<col>__year`, `__month`, "
        "`__day`, `__weekday`, `__elapsed_days`, and `__hour` for date-times).",
        "Nothing; declare another role in `column_roles_json` to treat it differently.",
    ),
}
"""Every code, in the order the error reference lists them."""
