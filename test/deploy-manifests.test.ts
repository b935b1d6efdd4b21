/**
 * deploy/kubernetes (Kustomize), offline: each overlay rendered with
 * `kubectl kustomize` (every component included at least once), then every
 * object against the Kubernetes OpenAPI schemas (the validators
 * `kubernetes-models` generates from them), with unknown fields rejected as
 * `kubectl apply --validate=strict` does; the hardening the README promises
 * (non-root, read-only root filesystem, no capabilities, probes, resources);
 * selectors that match; no Secret in any file; a config change that renames
 * the mounted ConfigMap (so the pods roll); and each gateway config through
 * the gateway's own loader with the env its pod gets.
 */
import t from 'tap'
import { readdir, readFile, writeFile, mkdtemp, rm, cp } from 'node:fs/promises'
import { join, relative } from 'node:path'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { tmpdir } from 'node:os'
import { randomBytes } from 'node:crypto'
import { parseAllDocuments } from 'yaml'
import { validate as validateConfigMap } from 'kubernetes-models/_schemas/IoK8sApiCoreV1ConfigMap'
import { validate as validateSecret } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Secret'
import { validate as validateService } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Service'
import { validate as validateDeployment } from 'kubernetes-models/_schemas/IoK8sApiAppsV1Deployment'
import { validate as validatePdb } from 'kubernetes-models/_schemas/IoK8sApiPolicyV1PodDisruptionBudget'
import { validate as validateNetworkPolicy } from 'kubernetes-models/_schemas/IoK8sApiNetworkingV1NetworkPolicy'
import { validate as validateIngress } from 'kubernetes-models/_schemas/IoK8sApiNetworkingV1Ingress'
import { validate as validateHpa } from 'kubernetes-models/_schemas/IoK8sApiAutoscalingV2HorizontalPodAutoscaler'
import { loadConfig } from '../core/config.ts'
import { builtins } from '../plugins/index.ts'
import { loadPlugins } from '../core/plugin-loader.ts'
import { Metrics } from '../core/observability/metrics.ts'
import { memoryLogger } from './helpers/logger.ts'
import { ROOT } from './helpers/cli.ts'

// The operator package exports its models, not their schema validators: take the
// validator file beside its entry point.
const { validate: validatePodMonitor } = (await import(
  new URL(
    './_schemas/ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1PodMonitor.js',
    import.meta.resolve('@kubernetes-models/prometheus-operator')
  ).href
)) as { validate: Validate }

type Validate = ((data: unknown) => boolean) & { errors?: { instancePath: string; keyword: string; params: object }[] | null }
const SCHEMAS: Record<string, Validate> = {
  'v1/ConfigMap': validateConfigMap,
  'v1/Secret': validateSecret,
  'v1/Service': validateService,
  'apps/v1/Deployment': validateDeployment,
  'policy/v1/PodDisruptionBudget': validatePdb,
  'networking.k8s.io/v1/NetworkPolicy': validateNetworkPolicy,
  'networking.k8s.io/v1/Ingress': validateIngress,
  'autoscaling/v2/HorizontalPodAutoscaler': validateHpa,
  'monitoring.coreos.com/v1/PodMonitor': validatePodMonitor,
}

/**
 * Schema errors plus fields the schema does not know. The generated
 * validators read every property they know (and enumerate maps such as
 * labels), so a field they never touched is one Kubernetes would reject under
 * strict field validation: the data goes through a Proxy that records reads.
 */
function strictErrors(validate: Validate, doc: unknown): string[] {
  const touched = new Map<object, Set<PropertyKey> | 'all'>()
  const wrap = (value: unknown): unknown => {
    if (value === null || typeof value !== 'object') return value
    const target = value
    return new Proxy(target, {
      get(o, key) {
        const seen = touched.get(o)
        if (seen !== 'all') touched.set(o, (seen ?? new Set()).add(key))
        return wrap(Reflect.get(o, key))
      },
      ownKeys(o) {
        touched.set(o, 'all')
        return Reflect.ownKeys(o)
      },
    })
  }
  const errors = validate(wrap(doc)) ? [] : (validate.errors ?? []).map(e => `${e.instancePath || '/'}: ${e.keyword} ${JSON.stringify(e.params)}`)
  const walk = (value: unknown, path: string): void => {
    if (value === null || typeof value !== 'object') return
    const seen = touched.get(value)
    for (const [k, v] of Object.entries(value)) {
      if (!Array.isArray(value) && seen !== 'all' && seen?.has(k) !== true) errors.push(`${path}/${k} is not a known field`)
      walk(v, `${path}/${k}`)
    }
  }
  walk(doc, '')
  return errors
}

interface K8sObject {
  apiVersion: string
  kind: string
  metadata: { name: string; labels?: Record<string, string> }
  [k: string]: unknown
}
interface Probe {
  exec?: { command: string[] }
  httpGet?: { path: string; port: string | number }
}
interface Container {
  name: string
  image: string
  args?: string[]
  ports?: { name?: string; containerPort: number }[]
  env?: { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string }; fieldRef?: { fieldPath: string } } }[]
  envFrom?: { configMapRef?: { name: string } }[]
  readinessProbe?: Probe
  livenessProbe?: Probe
  startupProbe?: Probe
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> }
  securityContext?: { allowPrivilegeEscalation?: boolean; readOnlyRootFilesystem?: boolean; runAsNonRoot?: boolean; capabilities?: { drop?: string[] } }
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[]
}
interface Deployment extends K8sObject {
  spec: {
    selector: { matchLabels: Record<string, string> }
    template: {
      metadata: { labels: Record<string, string> }
      spec: {
        securityContext?: { runAsNonRoot?: boolean; runAsUser?: number }
        terminationGracePeriodSeconds?: number
        containers: Container[]
        volumes?: { name: string; configMap?: { name: string }; emptyDir?: object }[]
      }
    }
  }
}

const dir = join(ROOT, 'deploy/kubernetes')
const overlays = (await readdir(join(dir, 'overlays'))).sort()
const components = (await readdir(join(dir, 'components'))).sort()
const run = promisify(execFile)
const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }

/** `kubectl kustomize` of a folder; `with` adds components (as a user's overlay would). */
async function render(folder: string, withComponents: string[] = []): Promise<K8sObject[]> {
  let target = folder
  let tmp: string | undefined
  if (withComponents.length > 0) {
    tmp = await mkdtemp(join(dir, '.render-'))
    await writeFile(
      join(tmp, 'kustomization.yaml'),
      [
        'apiVersion: kustomize.config.k8s.io/v1beta1',
        'kind: Kustomization',
        `resources: [${relative(tmp, folder)}]`,
        `components: [${withComponents.map(c => relative(tmp!, join(dir, 'components', c))).join(', ')}]`,
        '',
      ].join('\n')
    )
    target = tmp
  }
  try {
    const { stdout } = await run('kubectl', ['kustomize', target], { maxBuffer: 16 << 20 })
    return parseAllDocuments(stdout)
      .map(d => d.toJS() as K8sObject)
      .filter(o => o !== null)
  } finally {
    if (tmp !== undefined) await rm(tmp, { recursive: true, force: true })
  }
}

t.test('the strict validator rejects a wrong type and an unknown field', async t => {
  const bad = {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: 'x', labels: { a: 'b' } },
    spec: {
      selector: { matchLabels: { a: 'b' } },
      template: {
        metadata: { labels: { a: 'b' } },
        spec: { containers: [{ name: 'c', image: 'i', securityContext: { runAsNonRoot: 'yes', readOnlyRootFileSystem: true } }] },
      },
    },
  }
  t.same(strictErrors(validateDeployment, bad).sort(), [
    '/spec/template/spec/containers/0/securityContext/readOnlyRootFileSystem is not a known field',
    '/spec/template/spec/containers/0/securityContext/runAsNonRoot: type {"type":"boolean"}',
  ])
  t.same(
    strictErrors(validateDeployment, { ...bad, spec: { ...bad.spec, template: { ...bad.spec.template, spec: { containers: [{ name: 'c', image: 'i' }] } } } }),
    [],
    'labels are a map: any key is fine'
  )
})

t.test('the three shapes and the optional parts are there', async t => {
  t.same(overlays, ['replicas-redis', 'sidecar', 'single'])
  t.same(components, ['ingress-tls', 'monitoring'])
})

t.test('no Secret with a value in any file: secrets are created out of band', async t => {
  const walk = async (folder: string): Promise<string[]> =>
    (
      await Promise.all((await readdir(folder, { withFileTypes: true })).map(e => (e.isDirectory() ? walk(join(folder, e.name)) : [join(folder, e.name)])))
    ).flat()
  for (const file of (await walk(dir)).filter(f => f.endsWith('.yaml'))) {
    const text = await readFile(file, 'utf8')
    t.notMatch(text, /^kind: Secret$/m, `${relative(dir, file)}: no Secret object`)
    t.notMatch(text, /secretGenerator/, `${relative(dir, file)}: no generated Secret`)
  }
  for (const overlay of overlays) {
    t.notOk(
      (await render(join(dir, 'overlays', overlay))).some(o => o.kind === 'Secret'),
      `${overlay}: renders no Secret`
    )
  }
})

t.test('a config change renames the mounted ConfigMap, so the pods roll', async t => {
  const copy = await mkdtemp(join(tmpdir(), 'mcpp-k8s-roll-'))
  t.teardown(() => rm(copy, { recursive: true, force: true }))
  await cp(dir, copy, { recursive: true })
  const mounted = (objects: K8sObject[]): string | undefined =>
    (objects.find(o => o.kind === 'Deployment') as Deployment | undefined)?.spec.template.spec.volumes?.find(v => v.name === 'config')?.configMap?.name
  for (const overlay of overlays) {
    const before = mounted(await render(join(copy, 'overlays', overlay)))
    t.match(before, /^mcp-proxy-config-[a-z0-9]+$/, `${overlay}: the ConfigMap's name carries a hash of its content`)
  }
  const edit = async (file: string): Promise<void> => {
    await writeFile(file, `${await readFile(file, 'utf8')}\n# changed\n`)
  }
  await edit(join(copy, 'base/config.yaml'))
  await edit(join(copy, 'overlays/replicas-redis/config.yaml'))
  for (const overlay of overlays) {
    const before = mounted(await render(join(dir, 'overlays', overlay)))
    const after = mounted(await render(join(copy, 'overlays', overlay)))
    t.not(after, before, `${overlay}: another name after the config changed`)
  }
})

const shapes = [
  ...overlays.map(o => ({ name: o, folder: join(dir, 'overlays', o), with: [] as string[] })),
  // Every component rendered at least once, on the single-replica shape.
  { name: `single + ${components.join(' + ')}`, folder: join(dir, 'overlays/single'), with: components },
]

for (const shape of shapes) {
  t.test(`${shape.name}: renders, valid against the Kubernetes schemas, hardened, wired together`, async t => {
    const objects = await render(shape.folder, shape.with)
    for (const o of objects) {
      const validate = SCHEMAS[`${o.apiVersion}/${o.kind}`]
      t.ok(validate, `${o.kind} ${o.metadata.name}: a known kind`)
      if (validate !== undefined) t.same(strictErrors(validate, o), [], `${o.kind} ${o.metadata.name}: valid`)
    }
    const of = <T extends K8sObject>(kind: string): T[] => objects.filter(o => o.kind === kind) as T[]
    const [deployment, more] = of<Deployment>('Deployment')
    t.ok(deployment !== undefined && more === undefined, 'one Deployment')
    if (deployment === undefined) return
    const pod = deployment.spec.template.spec
    const labels = deployment.spec.template.metadata.labels
    const selects = (selector: Record<string, string>): boolean => Object.entries(selector).every(([k, v]) => labels[k] === v)
    t.ok(selects(deployment.spec.selector.matchLabels), 'the Deployment selects its pods')

    t.equal(pod.securityContext?.runAsNonRoot, true, 'pod runs as non-root')
    t.equal(pod.securityContext?.runAsUser, 1000, 'as the image user')
    for (const c of pod.containers) {
      t.same(
        c.securityContext,
        { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } },
        `${c.name}: locked down`
      )
      t.ok(
        c.resources?.requests?.cpu !== undefined && c.resources.requests.memory !== undefined && c.resources.limits?.memory !== undefined,
        `${c.name}: resources`
      )
    }

    const gateway = pod.containers.find(c => c.image.startsWith('mcp-idp-gateway:'))
    t.equal(gateway?.image, `mcp-idp-gateway:${pkg.version}`, 'the image at the package version')
    t.ok(gateway, 'a gateway container')
    if (gateway === undefined) return
    t.same(gateway.args, ['-f', '/etc/mcp-proxy/config.yaml'], 'config at the documented path')
    // httpGet probes on the probe listener (probes.port), never the admin listener.
    t.same(gateway.readinessProbe?.httpGet, { path: '/readyz', port: 'probes' })
    t.same(gateway.livenessProbe?.httpGet, { path: '/healthz', port: 'probes' })
    t.same(gateway.startupProbe?.httpGet, { path: '/healthz', port: 'probes' })
    t.same(
      pod.containers.filter(c => (c.ports ?? []).length > 0).map(c => c.name),
      [gateway.name],
      'only the gateway exposes a port'
    )
    t.same(gateway.volumeMounts?.map(m => m.mountPath).sort(), ['/etc/mcp-proxy', '/tmp'])
    const tmpVolume = gateway.volumeMounts?.find(m => m.mountPath === '/tmp')?.name
    t.ok(pod.volumes?.find(v => v.name === tmpVolume)?.emptyDir, '/tmp is an emptyDir (HOME and TMPDIR of the image)')

    const services = of<K8sObject & { spec: { selector: Record<string, string>; ports: { port: number; targetPort: string | number }[] } }>('Service')
    t.equal(services.length, 1, 'one Service')
    for (const s of services) {
      t.ok(selects(s.spec.selector), `${s.metadata.name} selects the pods`)
      t.same(
        s.spec.ports.map(p => p.targetPort),
        [gateway.ports![0]!.name],
        'the Service reaches the gateway port only'
      )
    }
    for (const kind of ['PodDisruptionBudget', 'PodMonitor']) {
      for (const o of of<K8sObject & { spec: { selector: { matchLabels: Record<string, string> } } }>(kind)) {
        t.ok(selects(o.spec.selector.matchLabels), `${kind} ${o.metadata.name} covers the pods`)
      }
    }
    t.equal(of('PodDisruptionBudget').length, 1, 'a PodDisruptionBudget')
    for (const np of of<K8sObject & { spec: { podSelector: { matchLabels: Record<string, string> }; ingress: { ports: { port: string }[] }[] } }>(
      'NetworkPolicy'
    )) {
      t.ok(selects(np.spec.podSelector.matchLabels), `NetworkPolicy ${np.metadata.name} covers the pods`)
      t.same(np.spec.ingress.flatMap(r => r.ports.map(p => p.port)).sort(), ['mcp', 'probes'], 'only the MCP and probe ports take connections')
    }
    t.equal(of('NetworkPolicy').length, 1, 'a NetworkPolicy')
    for (const hpa of of<K8sObject & { spec: { scaleTargetRef: { kind: string; name: string } } }>('HorizontalPodAutoscaler')) {
      t.same(hpa.spec.scaleTargetRef, { apiVersion: 'apps/v1', kind: 'Deployment', name: deployment.metadata.name }, 'the HPA scales the Deployment')
      t.equal((deployment.spec as { replicas?: number }).replicas, undefined, 'the HPA owns the replica count')
    }
    for (const ingress of of<
      K8sObject & {
        metadata: { annotations?: Record<string, string> }
        spec: { tls: unknown[]; rules: { http: { paths: { backend: { service: { name: string; port: { name: string } } } }[] } }[] }
      }
    >('Ingress')) {
      t.ok(ingress.metadata.annotations?.['cert-manager.io/cluster-issuer'], 'TLS from cert-manager')
      t.ok(ingress.spec.tls.length > 0, 'TLS terminated')
      t.same(
        ingress.spec.rules.flatMap(r => r.http.paths.map(p => p.backend.service)),
        [{ name: services[0]?.metadata.name, port: { name: 'mcp' } }],
        "to the Service's MCP port"
      )
    }

    // The ConfigMap mounted at /etc/mcp-proxy passes the gateway's own checks
    // with exactly the environment the container gets.
    const configVolume = pod.volumes?.find(v => v.name === gateway.volumeMounts?.find(m => m.mountPath === '/etc/mcp-proxy')?.name)
    const configMap = of<K8sObject & { data: Record<string, string> }>('ConfigMap').find(c => c.metadata.name === configVolume?.configMap?.name)
    t.ok(configMap?.data['config.yaml'], 'the mounted ConfigMap holds config.yaml')
    // The env the container gets: the generated ConfigMaps (envFrom), the
    // downward API, and the Secret created out of band (a fresh random value
    // stands for each key the overlay's README line creates).
    const env: Record<string, string> = {}
    for (const ref of gateway.envFrom ?? []) {
      const source = of<K8sObject & { data: Record<string, string> }>('ConfigMap').find(c => c.metadata.name === ref.configMapRef?.name)
      t.ok(source, `envFrom ${ref.configMapRef?.name}: a ConfigMap of this overlay`)
      Object.assign(env, source?.data)
    }
    for (const e of gateway.env ?? []) {
      const ref = e.valueFrom?.secretKeyRef
      if (ref !== undefined) t.equal(ref.name, 'mcp-proxy-secrets', `${e.name}: from the Secret the overlay says to create`)
      // The downward API's pod IP: any address stands for it here.
      const field = e.valueFrom?.fieldRef?.fieldPath === 'status.podIP' ? '10.0.0.7' : undefined
      const secret = ref === undefined ? undefined : ref.key === 'REDIS_URL' ? 'redis://127.0.0.1:6379' : randomBytes(36).toString('base64')
      const value = secret ?? field ?? e.value
      t.ok(value !== undefined, `${e.name} has a value`)
      env[e.name] = value ?? ''
    }
    const tmp = await mkdtemp(join(tmpdir(), 'mcpp-k8s-'))
    t.teardown(() => rm(tmp, { recursive: true, force: true }))
    const configFile = join(tmp, 'config.yaml')
    await writeFile(configFile, configMap?.data['config.yaml'] ?? '')
    const loaded = await loadConfig(configFile, env, builtins)
    await loadPlugins({
      config: loaded.config,
      baseDir: loaded.baseDir,
      registry: builtins,
      env: { log: memoryLogger().log, config: loaded.config as never, baseUrl: '', metrics: new Metrics() },
      dryRun: true,
    })
    t.equal(loaded.config.mcp.port, gateway.ports![0]!.containerPort, 'mcp.port is the container port')
    t.equal(loaded.config.admin.host, '127.0.0.1', 'the admin listener stays on loopback')
    t.equal(loaded.config.probes?.port, gateway.ports!.find(p => p.name === 'probes')?.containerPort, 'probes.port is the container port the probes call')
    t.ok(
      (pod.terminationGracePeriodSeconds ?? 30) * 1000 > (loaded.config.probes?.shutdownDelayMs ?? 0) + loaded.config.mcp.limits.shutdownGraceMs,
      'the grace period covers the shutdown delay and the drain'
    )
    if (loaded.config.cluster !== undefined)
      t.equal(loaded.config.cluster.advertiseUrl, `http://10.0.0.7:${loaded.config.mcp.port}`, 'replicas relay to the pod IP')
    t.equal(loaded.config.admin.port, 15000, 'on the port mcp-proxy-healthcheck calls by default')
  })
}
