# SVD proxies: one job per backbone that an SPA-Cache method with the singular identifier needs.


rule svd:
    """Float32 thin SVD of every layer's value projection, W_v = A S B^T; stores S and B^T.
    Its inputs are prepare_backbone's (the checkpoint's files, its pinned sha256): it reruns when
    the backbone changes, never for SPA parameters (the rank is chosen when a generate job loads
    the file). It runs beside prepare_backbone, not after it, so every job that decodes sits at
    the same depth of the DAG with or without the proxies (the report's rule graph, which keeps
    one job per rule and depth, shows each rule once)."""
    input:
        unpack(backbone_input),
    output:
        f"{R}/backbones/{{backbone}}/proxies.safetensors",
    params:
        path=lambda w: checkpoint_dir(w.backbone),
        sha256=lambda w: as_json(CAMPAIGN.weight_sha256(w.backbone)),
    resources:
        mem_mb=RESOURCES["generate"]["mem_mb"],
    log:
        f"{R}/logs/svd/{{backbone}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe svd --path {params.path:q} --name {wildcards.backbone}"
        " --sha256 {params.sha256:q} --out {output} > {log} 2>&1 || show_failure {log}"
