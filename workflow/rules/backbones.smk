# Backbones: train the toy backbone (toy entries), then check any checkpoint and write its manifest.


rule train_toy:
    """Train the toy backbone with the masked-diffusion objective; saved in LLaDA's format."""
    output:
        directory(f"{R}/checkpoints/{{backbone}}"),
    params:
        options=lambda w: as_json(CAMPAIGN.toy_options(w.backbone)),
    threads: lambda w: CAMPAIGN.toy_options(w.backbone).get("threads", 2)
    resources:
        mem_mb=RESOURCES["train_toy"]["mem_mb"],
        runtime=RESOURCES["train_toy"]["runtime"],
    log:
        f"{R}/logs/train_toy/{{backbone}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe train-toy --out {output} --options {params.options:q}"
        " > {log} 2>&1 || show_failure {log}"


rule prepare_backbone:
    """Check that the checkpoint loads (config, shards, keys, shapes, tokenizer) and that its
    weight files have the pinned sha256 (the backbone's `sha256`, a shipped one's record);
    write its manifest, which carries the hashes to every job that loads the weights."""
    input:
        unpack(backbone_input),
    output:
        f"{R}/backbones/{{backbone}}/manifest.json",
    params:
        path=lambda w: checkpoint_dir(w.backbone),
        sha256=lambda w: as_json(CAMPAIGN.weight_sha256(w.backbone)),
        dtype=lambda w: config["backbones"][w.backbone]["dtype"],
        chat=lambda w: "--chat" if config["backbones"][w.backbone]["chat"] else "",
        hub=hub_flag,
    log:
        f"{R}/logs/prepare_backbone/{{backbone}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe prepare-backbone --path {params.path:q} --name {wildcards.backbone}"
        " --dtype {params.dtype} {params.chat} --sha256 {params.sha256:q} {params.hub}"
        " --out {output} > {log} 2>&1 || show_failure {log}"
