"""The pipeline's `finalize` step (under `dsl.ExitHandler`): end the run whatever happened to it.

    python -m asyncrl.cluster.finalize --run-url s3://B/P/RUN --status COMPLETE [--kfp-run-id KFP_RUN]

Argument parsing only: the rules (the `done` marker, `final_status.json`, the summary, the registered model, the
MLflow run's end, idempotence) are `asyncrl.run.finalize`'s; `--status` is the exit task's
`PipelineTaskFinalStatus.state` as KFP gives it ("COMPLETE", "FAILED", "CANCELED", ...), mapped to the run's
outcome by `asyncrl.run.documents.run_outcome` (a cancelled run ends KILLED in MLflow). A resumed run (the pipeline parameter
`resume_run_id`): the exit task cannot read the setup task's output (KFP forbids an exit task any upstream task),
so it gets the run id from the parameter and `--kfp-run-id`, the pipeline run it ends; it finalizes the run only if
that pipeline run is the one that resumed it last (`asyncrl.run.finalize.owns_run`). Otherwise (the resume was
refused, or setup never got that far, or a later pipeline run resumed it since) the run is left exactly as it is.
"""

from __future__ import annotations

import argparse
import json
import logging

from asyncrl.run.finalize import finalize, owns_run
from asyncrl.storage.run_layout import run_url
from asyncrl.storage.run_store import open_run

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.finalize", description=__doc__.splitlines()[0])
    p.add_argument("--run-url", required=True)
    p.add_argument("--status", default="Unknown", help="the pipeline's final state (KFP PipelineTaskFinalStatus.state: COMPLETE or SUCCEEDED, "
                   "FAILED, CANCELED or CANCELLED, ...)")
    p.add_argument("--kfp-run-id", default="", help="the pipeline run ending now; when it differs from the run id "
                   "of --run-url (a resume), the run is finalized only if this pipeline run resumed it")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s finalize %(name)s: %(message)s")
    try:
        store, paths = open_run(args.run_url)
    except ValueError as err:
        raise SystemExit(f"finalize: {err}") from None
    bucket, prefix, run_id = store.bucket, paths.prefix, paths.run_id
    if args.kfp_run_id and not owns_run(store, paths, args.kfp_run_id):
        log.info("run %s was not resumed by pipeline run %s (the resume was refused or never made): left as it is",
                 run_id, args.kfp_run_id)
        print(json.dumps({"run_url": run_url(bucket, prefix, run_id), "finalized": False}))
        return
    doc = finalize(store, paths, args.status)
    print(json.dumps({"run_url": run_url(bucket, prefix, run_id), **doc}))


if __name__ == "__main__":
    main()
