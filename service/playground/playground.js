// The playground: streams POST /generate (server-sent events over fetch) into one pane per checkpoint.
"use strict";

const $ = (id) => document.getElementById(id);
let models = [];

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function setStatus(text) { $("status").textContent = text; }

function fill(select, options) {
  select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
}

async function loadModels() {
  const r = await fetch("/models", { headers: headers() });
  if (!r.ok) { setStatus(`GET /models: ${r.status}${r.status === 401 ? " (enter an API key)" : ""}`); return; }
  models = (await r.json()).models;
  fill($("model"), [...new Set(models.map((m) => m.model))].map((f) => [f, f]));
  fillCheckpoints();
  setStatus("");
}

function fillCheckpoints() {
  const here = models.filter((m) => m.model === $("model").value);
  const options = here.map((m) => [m.checkpoint, `${m.checkpoint} (${m.decomposition}, r=${m.rank})`]);
  fill($("checkpoint-a"), options);
  fill($("checkpoint-b"), options);
  // A: the checkpoint the server serves by default (the most head outputs per position, then the higher rank);
  // B: a rank-1 model (the MDM's own head) to compare it with
  const joint = here.filter((m) => m.head !== "base").sort((x, y) =>
    (y.outputs_per_position - x.outputs_per_position) || (y.rank - x.rank))[0];
  const rank1 = here.find((m) => m.head === "base") || here.find((m) => m !== joint);
  if (joint) $("checkpoint-a").value = joint.checkpoint;
  if (rank1) $("checkpoint-b").value = rank1.checkpoint;
}

function request(checkpoint, rankOneView = false) {
  const m = models.find((x) => x.checkpoint === checkpoint);
  const body = {
    checkpoint: m.checkpoint, stream: true, step_tokens: true,
    steps: Number($("steps").value), num_samples: Number($("num-samples").value), ordering: $("ordering").value,
    sampler: $("sampler").value, eb_gamma: Number($("eb-gamma").value), temperature: Number($("temperature").value),
    adaptive_path: $("adaptive-path").value,
    joint: $("joint").checked && !rankOneView, unique: $("unique").checked,
  };
  if (m.base === "ar") {  // an autoregressive checkpoint: one token a step, left to right
    Object.assign(body, {ordering: "left_to_right", sampler: "fixed", steps: Math.max(body.steps, m.length)});
  }
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("prompt").value) body.prompt = $("prompt").value;
  if ($("valid-only").checked && m.validates) body.valid_only = true;
  return [body, m];
}

function newPane(model, joint) {
  const pane = $("pane").content.firstElementChild.cloneNode(true);
  const view = joint ? "" : " (rank-1 view: each position from the joint's marginals)";
  pane.querySelector(".title").textContent = `${model.checkpoint}: ${model.decomposition}, rank ${model.rank}${view}`;
  pane.dataset.checkpoint = model.checkpoint;
  pane.classList.add(model.domain);
  pane.dataset.steps = "0";
  $("panes").append(pane);
  return pane;
}

function showStep(pane, ev, total) {
  pane.dataset.steps = String(Number(pane.dataset.steps) + 1);
  const round = ev.round ? ` (round ${ev.round + 1})` : "";
  pane.querySelector(".progress").textContent = `step ${ev.step} of at most ${total}${round}`;
  const rows = ev.tokens.map((tokens, i) => {
    const fresh = new Set(ev.committed[i]);
    const div = document.createElement("div");
    div.className = "seq";
    tokens.forEach((t, pos) => {
      if (t === "") return;  // padding
      const span = document.createElement("span");
      span.className = "tok" + (t === "[MASK]" ? " mask" : "") + (fresh.has(pos) ? " new" : "");
      span.textContent = t === "[MASK]" ? "_" : t;
      div.append(span);
    });
    return div;
  });
  pane.querySelector(".sequences").replaceChildren(...rows);
}

async function picture(smiles) {
  const r = await fetch(`/depict?width=200&height=160&smiles=${encodeURIComponent(smiles)}`, { headers: headers() });
  if (!r.ok) return null;
  return URL.createObjectURL(await r.blob());
}

async function showAnswer(pane, answer, model) {
  const samples = answer.samples;
  pane.querySelector(".sequences").replaceChildren(...samples.map((s) => {
    const div = document.createElement("div");
    div.className = "seq";
    div.textContent = s.text;
    return div;
  }));
  const took = `${answer.steps} steps, ${answer.model_calls} model calls, ${answer.timings.total_ms.toFixed(0)} ms`;
  if (!model.validates) {
    pane.querySelector(".summary").textContent = `${samples.length} samples; ${took}`;
    pane.dataset.done = "1";
    return;
  }
  const valid = samples.filter((s) => s.valid);
  const unique = new Set(valid.map((s) => s.canonical ?? s.text));
  pane.querySelector(".summary").textContent =
    `valid ${valid.length}/${samples.length} (${(100 * valid.length / Math.max(1, samples.length)).toFixed(0)}%), ` +
    `unique ${unique.size}, drawn ${answer.drawn}; ${took}`;
  const cells = samples.map((s) => {
    const cell = document.createElement("figure");
    cell.className = "mol " + (s.valid ? "valid" : "invalid");
    const code = document.createElement("code");
    code.textContent = s.text || "(empty)";
    const note = document.createElement("figcaption");
    note.textContent = !s.valid ? "invalid" : s.qed == null ? "valid"
      : `QED ${s.qed.toFixed(2)} · logP ${s.logp.toFixed(1)} · ${s.mol_weight.toFixed(0)} g/mol`;
    cell.append(code, note);
    return [cell, s];
  });
  pane.querySelector(".molecules").replaceChildren(...cells.map(([c]) => c));
  if (!model.depicts) return;
  await Promise.all(cells.filter(([, s]) => s.valid).map(async ([cell, s]) => {
    const url = await picture(s.canonical);
    if (!url) return;
    const img = document.createElement("img");
    img.alt = s.canonical;
    img.src = url;
    cell.prepend(img);
  }));
  pane.dataset.done = "1";
}

function parseEvent(block) {
  let event = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) event = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  return [event, data ? JSON.parse(data) : null];
}

async function run(checkpoint, index) {
  const rankOneView = index === 1 && checkpoint === $("checkpoint-a").value;  // the same checkpoint twice
  const [body, model] = request(checkpoint, rankOneView);
  const pane = newPane(model, body.joint);
  const r = await fetch("/generate", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!r.ok) {
    const detail = await r.json().catch(() => ({}));
    const first = Array.isArray(detail.detail) ? detail.detail[0] : null;
    pane.querySelector(".summary").textContent = first ? `${r.status}: ${first.loc.at(-1)}: ${first.msg}`
      : `${r.status}: ${detail.detail || r.statusText}`;
    pane.dataset.done = "error";
    return;
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const [event, data] = parseEvent(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (event === "step") showStep(pane, data, body.steps);
      else if (event === "done") await showAnswer(pane, data, model);
      else if (event === "error") {
        pane.querySelector(".summary").textContent = `error (${data.code}): ${data.error}`;
        pane.dataset.done = "error";
      }
    }
  }
}

async function generate(e) {
  e.preventDefault();
  localStorage.setItem("ttcore-api-key", $("api-key").value);
  if (!models.length) await loadModels();
  $("panes").replaceChildren();
  document.body.dataset.state = "running";
  $("generate").disabled = true;
  const checkpoints = [$("checkpoint-a").value];
  if ($("compare").checked) checkpoints.push($("checkpoint-b").value);
  try {
    await Promise.all(checkpoints.map(run));  // side by side: both stream at once (the same one twice: joint vs rank-1 view)
  } catch (err) {
    setStatus(String(err));
  } finally {
    $("generate").disabled = false;
    document.body.dataset.state = "done";
  }
}

window.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = localStorage.getItem("ttcore-api-key") || "";
  $("model").addEventListener("change", fillCheckpoints);
  $("compare").addEventListener("change", () => { $("checkpoint-b").disabled = !$("compare").checked; });
  $("api-key").addEventListener("change", loadModels);
  $("form").addEventListener("submit", generate);
  loadModels();
});
