/**
 * deploy/kubernetes/*.yaml, offline: every object against the Kubernetes
 * OpenAPI schemas (the validators `kubernetes-models` generates from them),
 * with unknown fields rejected as `kubectl apply --validate=strict` does; the
 * hardening the README promises (non-root, read-only root filesystem, no
 * capabilities, probes, resources); selectors that match; and each ConfigMap's
 * gateway config through the gateway's own loader with the env its pod sets.
 */
import t from 'tap'
import { readdir, readFile, writeFile, mkdtemp, rm } from 'node:fs/promises'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { parseAllDocuments } from 'yaml'
import { validate as validateConfigMap } from 'kubernetes-models/_schemas/IoK8sApiCoreV1ConfigMap'
import { validate as validateSecret } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Secret'
import { validate as validateService } from 'kubernetes-models/_schemas/IoK8sApiCoreV1Service'
import { validate as validateDeployment } from 'kubernetes-models/_schemas/IoK8sApiAppsV1Deployment'
import { validate as validatePdb } from 'kubernetes-models/_schemas/IoK8sApiPolicyV1PodDisruptionBudget'
import { loadConfig } from '../core/config.ts'
import { builtins } from '../plugins/index.ts'
import { loadPlugins } from '../core/plugin-loader.ts'
import { Metrics } from '../core/metrics.ts'
import { memoryLogger } from './helpers/logger.ts'
import { ROOT } from './helpers/cli.ts'

type Validate = ((data: unknown) => boolean) & { errors?: { instancePath: string; keyword: string; params: object }[] | null }
const SCHEMAS: Record<string, Validate> = {
  'v1/ConfigMap': validateConfigMap,
  'v1/Secret': validateSecret,
  'v1/Service': validateService,
  'apps/v1/Deployment': validateDeployment,
  'policy/v1/PodDisruptionBudget': validatePdb,
}

/**
 * Schema errors plus fields the schema does not know. The generated
 * validators read every property they know (and enumerate maps such as
 * labels), so a field they never touched is one Kubernetes would reject under
 * strict field validation: the data goes through a Proxy that records reads.
 */
function strictErrors (validate: Validate, doc: unknown): string[] {
  const touched = new Map<object, Set<PropertyKey> | 'all'>()
  const wrap = (value: unknown): unknown => {
    if (value === null || typeof value !== 'object') return value
    const target = value
    return new Proxy(target, {
      get (o, key) {
        const seen = touched.get(o)
        if (seen !== 'all') touched.set(o, (seen ?? new Set()).add(key))
        return wrap(Reflect.get(o, key))
      },
      ownKeys (o) { touched.set(o, 'all'); return Reflect.ownKeys(o) },
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

interface K8sObject { apiVersion: string; kind: string; metadata: { name: string; labels?: Record<string, string> }; [k: string]: unknown }
interface Probe { exec?: { command: string[] }; httpGet?: { path: string; port: string | number } }
interface Container {
  name: string; image: string; args?: string[]; ports?: { name?: string; containerPort: number }[]
  env?: { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string }; fieldRef?: { fieldPath: string } } }[]
  readinessProbe?: Probe; livenessProbe?: Probe; startupProbe?: Probe
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> }
  securityContext?: { allowPrivilegeEscalation?: boolean; readOnlyRootFilesystem?: boolean; runAsNonRoot?: boolean; capabilities?: { drop?: string[] } }
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[]
}
interface Deployment extends K8sObject {
  spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: {
    securityContext?: { runAsNonRoot?: boolean; runAsUser?: number }
    terminationGracePeriodSeconds?: number
    containers: Container[]
    volumes?: { name: string; configMap?: { name: string }; emptyDir?: object }[]
  } } }
}

const dir = join(ROOT, 'deploy/kubernetes')
const files = (await readdir(dir)).filter(f => f.endsWith('.yaml')).sort()

async function load (file: string): Promise<K8sObject[]> {
  const docs = parseAllDocuments(await readFile(join(dir, file), 'utf8'))
  return (Array.isArray(docs) ? docs : [docs]).map(d => d.toJS() as K8sObject).filter(o => o !== null)
}

t.test('the strict validator rejects a wrong type and an unknown field', async t => {
  const bad = {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'x', labels: { a: 'b' } },
    spec: { selector: { matchLabels: { a: 'b' } }, template: { metadata: { labels: { a: 'b' } }, spec: { containers: [{ name: 'c', image: 'i', securityContext: { runAsNonRoot: 'yes', readOnlyRootFileSystem: true } }] } } },
  }
  t.same(strictErrors(validateDeployment, bad).sort(), [
    '/spec/template/spec/containers/0/securityContext/readOnlyRootFileSystem is not a known field',
    '/spec/template/spec/containers/0/securityContext/runAsNonRoot: type {"type":"boolean"}',
  ])
  t.same(strictErrors(validateDeployment, { ...bad, spec: { ...bad.spec, template: { ...bad.spec.template, spec: { containers: [{ name: 'c', image: 'i' }] } } } }), [], 'labels are a map: any key is fine')
})

t.test('both shapes are there', async t => {
  t.same(files, ['gateway.yaml', 'sidecar.yaml'])
})

for (const file of files) {
  t.test(`${file}: valid against the Kubernetes schemas, hardened, wired together`, async t => {
    const objects = await load(file)
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
      t.same(c.securityContext, { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } }, `${c.name}: locked down`)
      t.ok(c.resources?.requests?.cpu !== undefined && c.resources.requests.memory !== undefined && c.resources.limits?.memory !== undefined, `${c.name}: resources`)
    }

    const gateway = pod.containers.find(c => c.image.startsWith('mcp-idp-gateway:'))
    t.ok(gateway, 'a gateway container')
    if (gateway === undefined) return
    t.same(gateway.args, ['-f', '/etc/mcp-proxy/config.yaml'], 'config at the documented path')
    // httpGet probes on the probe listener (probes.port), never the admin listener.
    t.same(gateway.readinessProbe?.httpGet, { path: '/readyz', port: 'probes' })
    t.same(gateway.livenessProbe?.httpGet, { path: '/healthz', port: 'probes' })
    t.same(gateway.startupProbe?.httpGet, { path: '/healthz', port: 'probes' })
    t.same(pod.containers.filter(c => (c.ports ?? []).length > 0).map(c => c.name), [gateway.name], 'only the gateway exposes a port')
    t.same(gateway.volumeMounts?.map(m => m.mountPath).sort(), ['/etc/mcp-proxy', '/tmp'])
    const tmpVolume = gateway.volumeMounts?.find(m => m.mountPath === '/tmp')?.name
    t.ok(pod.volumes?.find(v => v.name === tmpVolume)?.emptyDir, '/tmp is an emptyDir (HOME and TMPDIR of the image)')

    const services = of<K8sObject & { spec: { selector: Record<string, string>; ports: { port: number; targetPort: string | number }[] } }>('Service')
    t.equal(services.length, 1, 'one Service')
    for (const s of services) {
      t.ok(selects(s.spec.selector), `${s.metadata.name} selects the pods`)
      t.same(s.spec.ports.map(p => p.targetPort), [gateway.ports![0]!.name], 'the Service reaches the gateway port only')
    }
    for (const pdb of of<K8sObject & { spec: { selector: { matchLabels: Record<string, string> } } }>('PodDisruptionBudget')) {
      t.ok(selects(pdb.spec.selector.matchLabels), `${pdb.metadata.name} covers the pods`)
    }

    // The ConfigMap mounted at /etc/mcp-proxy passes the gateway's own checks
    // with exactly the environment the container gets.
    const configVolume = pod.volumes?.find(v => v.name === gateway.volumeMounts?.find(m => m.mountPath === '/etc/mcp-proxy')?.name)
    const configMap = of<K8sObject & { data: Record<string, string> }>('ConfigMap').find(c => c.metadata.name === configVolume?.configMap?.name)
    t.ok(configMap?.data['config.yaml'], 'the mounted ConfigMap holds config.yaml')
    const secrets = of<K8sObject & { stringData?: Record<string, string> }>('Secret')
    const env: Record<string, string> = {}
    for (const e of gateway.env ?? []) {
      const ref = e.valueFrom?.secretKeyRef
      // The downward API's pod IP: any address stands for it here.
      const field = e.valueFrom?.fieldRef?.fieldPath === 'status.podIP' ? '10.0.0.7' : undefined
      const value = ref !== undefined ? secrets.find(s => s.metadata.name === ref.name)?.stringData?.[ref.key] : field ?? e.value
      t.ok(value !== undefined, `${e.name} has a value in this file`)
      env[e.name] = value ?? ''
    }
    const tmp = await mkdtemp(join(tmpdir(), 'mcpp-k8s-'))
    t.teardown(() => rm(tmp, { recursive: true, force: true }))
    const configFile = join(tmp, 'config.yaml')
    await writeFile(configFile, configMap?.data['config.yaml'] ?? '')
    const loaded = await loadConfig(configFile, env, builtins)
    await loadPlugins({ config: loaded.config, baseDir: loaded.baseDir, registry: builtins, env: { log: memoryLogger().log, config: loaded.config as never, baseUrl: '', metrics: new Metrics() }, dryRun: true })
    t.equal(loaded.config.mcp.port, gateway.ports![0]!.containerPort, 'mcp.port is the container port')
    t.equal(loaded.config.admin.host, '127.0.0.1', 'the admin listener stays on loopback')
    t.equal(loaded.config.probes?.port, gateway.ports!.find(p => p.name === 'probes')?.containerPort, 'probes.port is the container port the probes call')
    t.ok((pod.terminationGracePeriodSeconds ?? 30) * 1000 > (loaded.config.probes?.shutdownDelayMs ?? 0) + loaded.config.mcp.limits.shutdownGraceMs, 'the grace period covers the shutdown delay and the drain')
    if (loaded.config.cluster !== undefined) t.equal(loaded.config.cluster.advertiseUrl, `http://10.0.0.7:${loaded.config.mcp.port}`, 'replicas relay to the pod IP')
    t.equal(loaded.config.admin.port, 15000, 'on the port mcp-proxy-healthcheck calls by default')
  })
}
