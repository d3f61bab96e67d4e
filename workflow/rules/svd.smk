# SVD proxies: one job per backbone that an SPA-Cache method with the singular identifier needs.


rule svd:
    """Float32 thin SVD of every layer's value projection, W_v = A S B^T; stores S and B^T.
    Its only input is the manifest: it reruns when the backbone changes, never for SPA
    parameters (the rank is chosen when a generate job loads the file)."""
    input:
        manifest=f"{R}/backbones/{{backbone}}/manifest.json",
    output:
        f"{R}/backbones/{{backbone}}/proxies.safetensors",
    resources:
        mem_mb=RESOURCES["generate"]["mem_mb"],
    log:
        f"{R}/logs/svd/{{backbone}}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "python -m dlmpipe svd --manifest {input.manifest} --out {output} > {log} 2>&1"
