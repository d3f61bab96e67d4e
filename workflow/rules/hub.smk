# Hugging Face Hub repositories (dlmpipe/hub.py): a backbone's `hub` and a task's dataset ids,
# resolved to commits when the campaign is checked. A local job (where Snakemake runs, which has
# the network: the login node on a cluster) fetches each into the Hugging Face cache before any
# job reads it, checks the weights' sha256 against the Hub's record and writes what it fetched;
# with everything fetched before (the user command `fetch CONFIG`) it runs offline.


rule fetch_backbone:
    """A Hub checkpoint at its commit: the files dlmpipe reads (configs, safetensors,
    tokenizer), resumed where a fetch stopped; its record (repository, revision, commit, the
    sha256 checked) goes into the manifest."""
    output:
        f"{R}/backbones/{{backbone}}/hub.json",
    params:
        repos=lambda w: as_json(CAMPAIGN.hub_fetches("backbones", w.backbone)),
    localrule: True
    log:
        f"{R}/logs/fetch_backbone/{{backbone}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe fetch-hub --repos {params.repos:q} --out {output}"
        " > {log} 2>&1 || show_failure {log}"


rule fetch_dataset:
    """A task's dataset ids at their commits (every file of each); prepare_task reads them
    from the cache and records the commits in the task's table."""
    output:
        f"{R}/tasks/{{task}}.hub.json",
    params:
        repos=lambda w: as_json(CAMPAIGN.hub_fetches("tasks", w.task)),
    localrule: True
    log:
        f"{R}/logs/fetch_dataset/{{task}}.log",
    conda:
        "../../envs/score.yaml"
    shell:
        "python -m dlmpipe fetch-hub --repos {params.repos:q} --out {output}"
        " > {log} 2>&1 || show_failure {log}"
