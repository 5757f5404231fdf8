"""The viewer's single page (HTML, CSS and vanilla JS, no build step).

Kept as Python strings so they ship without new package-data globs. The page holds no inline
script or style: the server sends them as ``/app.js`` and ``/app.css`` under a
Content-Security-Policy that allows only same-origin scripts, so even a model output that
slipped past escaping could not run. Routes live in the URL
hash (``#/cells?model=...``, ``#/cell?id=...``, ``#/call?id=...``, ``#/dialogue?cell=...``,
``#/compare?cell=...``), so a link from report.html opens a filtered view directly.
"""

INDEX_HTML = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>biaslab view</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/app.css"></head>
<body>
<header><h1>biaslab view</h1><nav><a href="#/cells">Cells</a><a href="#/calls">Calls</a><a id="report-link" href="/report.html" hidden>Report</a></nav>
<span class="run" id="run"></span></header>
<main id="app">loading…</main>
<script src="/app.js"></script></body></html>
"""

APP_CSS = r"""body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header{background:#16324f;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:baseline}
header h1{font-size:18px;margin:0}header a{color:#cfe3f7;text-decoration:none;margin-right:14px}
header .run{opacity:.8;font-size:12px}
main{padding:12px 20px 40px;max-width:1400px}
.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin-bottom:10px}
.filters label{display:flex;flex-direction:column;font-size:11px;color:#444}
.filters select,.filters input{font-size:13px;padding:2px 4px;min-width:90px}
table{border-collapse:collapse;font-size:12.5px;background:#fff}
th,td{border:1px solid #e0e0e0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f1f1f1}
.status-done{color:#117733}.status-error{color:#cc3311;font-weight:600}.status-running{color:#ee7733}
.pager{margin:8px 0;display:flex;gap:10px;align-items:center}
.msg{border:1px solid #ddd;border-radius:5px;margin:6px 0;background:#fff}
.msg .role{font-size:11px;text-transform:uppercase;background:#f3f3f3;padding:2px 8px;color:#555}
.msg pre,.box pre{white-space:pre-wrap;word-wrap:break-word;margin:0;padding:6px 8px;font:12.5px/1.45 ui-monospace,Menlo,Consolas,monospace}
mark.exposure{background:#ffd27f;outline:1px solid #e69f00;padding:0 1px}
mark.mitigation{background:#c8ecd4;outline:1px solid #117733;padding:0 1px}
mark.changed{background:#cfe3f7;outline:1px solid #0077bb;padding:0 1px}
.pair{align-items:stretch;border-top:1px dashed #ddd}
.pair>.box{margin:6px 0}
.box{border:1px solid #ddd;border-radius:5px;background:#fff;margin:8px 0;padding:4px 8px}
.box h4{margin:4px 0;font-size:13px}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:12.5px}
.kv dt{color:#555}.kv dd{margin:0}
.err{color:#cc3311}
.two{display:grid;grid-template-columns:1fr 1fr;gap:14px}
.strip{display:flex;gap:3px;margin:8px 0 14px}
.strip span{width:34px;height:22px;display:flex;align-items:center;justify-content:center;font-size:11px;border-radius:3px;color:#fff}
.lab-biased{background:#cc3311}.lab-not{background:#0077bb}.lab-none{background:#999}
.legend{display:flex;gap:14px;align-items:center;font-size:12px;color:#444;margin:-6px 0 12px}
.legend span{display:inline-block;width:22px;height:16px;border-radius:3px;color:#fff;text-align:center;font-size:11px;margin-right:4px}
details.box summary{cursor:pointer;padding:3px 0}
details.box summary .muted{margin-left:8px}
.turn{display:grid;grid-template-columns:60px 1fr 1fr 260px;gap:10px;border-top:1px solid #ddd;padding:8px 0}
.turn .u,.turn .t{background:#fff;border:1px solid #e3e3e3;border-radius:5px;padding:6px 8px;white-space:pre-wrap}
.turn .meta{font-size:12px}
.badge{display:inline-block;border-radius:3px;padding:0 5px;color:#fff;font-size:11px}
.muted{color:#666;font-size:12px}
a{color:#0060a0}
"""

APP_JS = r""""use strict";
const FILTERS = ["protocol","variant","condition","mitigation","exposure","model","seed","status","item","q"];
let META = null;
const app = document.getElementById("app");
function esc(s){return String(s==null?"":s).replace(/[&<>"']/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));}
function qs(obj){return Object.entries(obj).filter(([k,v])=>v!==""&&v!=null).map(([k,v])=>encodeURIComponent(k)+"="+encodeURIComponent(v)).join("&");}
async function api(route, params){
  const r = await fetch("/api/"+route+"?"+qs(params||{}));
  const data = await r.json();
  if(!r.ok) throw new Error(data.error||r.statusText);
  return data;
}
function parseHash(){
  const h = location.hash.replace(/^#\/?/,"");
  const [path, query] = h.split("?");
  const params = {};
  new URLSearchParams(query||"").forEach((v,k)=>{params[k]=v;});
  return {path: path||"cells", params};
}
function go(path, params){location.hash = "#/"+path+(params&&qs(params)?"?"+qs(params):"");}
function fmt(v){if(v==null)return "";if(typeof v==="number"&&!Number.isInteger(v))return v.toFixed(3);return String(v);}
function pretty(v){return typeof v==="string"?v:JSON.stringify(v,null,2);}

function marked(content, spans, mitigations){
  const all = (spans||[]).map(([a,b])=>[a,b,"exposure","exposure text"])
    .concat((mitigations||[]).map(([a,b])=>[a,b,"mitigation","mitigation text"])).sort((x,y)=>x[0]-y[0]);
  if(!all.length) return esc(content);
  let out="", pos=0;
  for(const [a,b,cls,title] of all){ if(a<pos) continue; out+=esc(content.slice(pos,a))+`<mark class="${cls}" title="${title}">`+esc(content.slice(a,b))+"</mark>"; pos=b; }
  return out+esc(content.slice(pos));
}
function messagesHtml(call){
  return (call.messages||[]).map((m,i)=>`<div class="msg"><div class="role">${esc(m.role)}</div><pre>${marked(m.content||"", (call.highlights||[])[i], (call.mitigation_highlights||[])[i])}</pre></div>`).join("");
}

async function viewCells(params){
  const page = Object.assign({limit:50, offset:0}, params);
  const data = await api("cells", page);
  const f = META.facets;
  const sel = (name, values) => `<label>${name}<select data-f="${name}"><option value="">(all)</option>${values.map(v=>`<option ${String(params[name])===String(v)?"selected":""}>${esc(v)}</option>`).join("")}</select></label>`;
  const inp = (name, ph) => `<label>${name}<input data-f="${name}" placeholder="${ph}" value="${esc(params[name]||"")}"></label>`;
  const from = data.total ? data.offset+1 : 0, to = data.offset + data.rows.length;
  app.innerHTML = `<h2>Cells</h2>
  <div class="filters" id="filters">${sel("protocol",f.protocol)}${sel("variant",f.variant)}${sel("condition",f.condition)}${(f.mitigation||[]).length?sel("mitigation",f.mitigation):""}
  ${sel("exposure",["clean","exposed"])}${sel("model",f.model)}${sel("seed",f.seed)}${sel("status",f.status)}
  ${inp("item","exact item")}${inp("q","cell id contains")}<button id="clear">clear</button></div>
  <div class="pager"><span id="count">${from}–${to} of ${data.total} cells</span>
  <button id="prev" ${data.offset?"":"disabled"}>prev</button><button id="next" ${to<data.total?"":"disabled"}>next</button></div>
  <table id="cells"><thead><tr><th>cell</th><th>variant</th><th>item</th><th>condition</th><th>model</th><th>seed</th><th>status</th><th>calls</th><th></th></tr></thead><tbody>
  ${data.rows.map(c=>`<tr data-cell="${esc(c.cell_id)}"><td><a href="#/cell?${qs({id:c.cell_id})}">${esc(c.cell_id)}</a></td><td>${esc(c.variant)}</td><td>${esc(c.item)}</td><td>${esc(c.condition)}</td><td>${esc(c.model)}</td><td>${esc(c.seed)}</td><td class="status-${esc(c.status)}">${esc(c.status)}${c.damaged?` <span class="err damaged" title="${esc(c.damaged)}">damaged</span>`:""}</td><td>${c.n_calls}</td>
  <td><a href="#/compare?${qs({cell:c.cell_id})}">compare</a>${META.has_dialogues?` · <a class="dlg" href="#/dialogue?${qs({cell:c.cell_id})}">dialogue</a>`:""}</td></tr>`).join("")}
  </tbody></table>`;
  const current = () => { const p={}; FILTERS.forEach(k=>{ if(params[k]) p[k]=params[k]; }); return p; };
  app.querySelectorAll("[data-f]").forEach(el=>el.addEventListener("change",()=>{ const p=current(); p[el.dataset.f]=el.value; delete p.offset; go("cells",p); }));
  document.getElementById("clear").onclick=()=>go("cells",{});
  document.getElementById("prev").onclick=()=>go("cells",Object.assign(current(),{offset:Math.max(0,data.offset-data.limit)}));
  document.getElementById("next").onclick=()=>go("cells",Object.assign(current(),{offset:data.offset+data.limit}));
}

async function viewCalls(params){
  const data = await api("calls", Object.assign({limit:50}, params));
  const inp = (name, ph) => `<label>${name}<input data-f="${name}" placeholder="${ph}" value="${esc(params[name]||"")}"></label>`;
  app.innerHTML = `<h2>Calls</h2><div class="filters">${inp("node","node")}${inp("model","model")}${inp("condition","condition")}
   <label>parse failures<select data-f="parse_error"><option value="">(all)</option><option value="1" ${params.parse_error==="1"?"selected":""}>only</option></select></label></div>
   <table><thead><tr><th>id</th><th>cell</th><th>node</th><th>item</th><th>sample</th><th>exposed</th><th>tokens in/out</th><th>cache</th><th>parse</th></tr></thead><tbody>
   ${data.rows.map(c=>`<tr><td><a href="#/call?id=${c.id}">${c.id}</a></td><td>${esc(c.cell_id)}</td><td>${esc(c.node)}</td><td>${esc(c.item)}</td><td>${c.sample}</td><td>${c.exposed?"yes":""}</td><td>${c.input_tokens}/${c.output_tokens}</td><td>${c.cache_hit?"hit":""}</td><td class="err">${esc(c.damaged||c.parse_error||c.error||"")}</td></tr>`).join("")}
   </tbody></table><div class="pager">${data.more?`<button id="more">next page</button>`:"end"}</div>`;
  app.querySelectorAll("[data-f]").forEach(el=>el.addEventListener("change",()=>{ const p=Object.assign({},params); p[el.dataset.f]=el.value; delete p.after; go("calls",p); }));
  if(data.more) document.getElementById("more").onclick=()=>go("calls",Object.assign({},params,{after:data.next_after}));
}

function coordsHtml(cell){
  return `<dl class="kv"><dt>cell</dt><dd>${esc(cell.cell_id)}</dd><dt>protocol</dt><dd>${esc(cell.protocol)}</dd><dt>variant</dt><dd>${esc(cell.variant)}</dd><dt>item</dt><dd>${esc(cell.item)}</dd><dt>condition</dt><dd>${esc(cell.condition)}</dd><dt>model</dt><dd>${esc(cell.model)}</dd><dt>seed</dt><dd>${esc(cell.seed)}</dd><dt>status</dt><dd class="status-${esc(cell.status)}">${esc(cell.status)} ${esc(cell.error||"")}</dd></dl>`;
}

function inputsHtml(inputs){
  if(!inputs||!Object.keys(inputs).length) return "";
  return `<h3>Item</h3><dl class="kv" id="inputs">${Object.entries(inputs).map(([k,v])=>`<dt>${esc(k)}</dt><dd>${esc(fmt(v))}</dd>`).join("")}</dl>`;
}
function outputsHtml(outputs){
  return `<h3>Node outputs</h3><p class="muted">${outputs.length} state updates, folded: open one to read it.</p><div id="outputs">${outputs.map(o=>{
    const keys = (o.value&&typeof o.value==="object"&&!Array.isArray(o.value)) ? Object.keys(o.value).join(", ") : typeof o.value;
    const text = pretty(o.value);
    return `<details class="box"><summary><b>${esc(o.node)}</b><span class="muted">#${o.seq} · ${esc(o.damaged?"damaged":keys)} · ${text.length} characters</span></summary>${o.damaged?`<pre class="err">${esc(o.damaged)}</pre>`:`<pre>${esc(text)}</pre>`}</details>`;}).join("")}</div>`;
}

async function viewCell(params){
  const d = await api("cell", {id: params.id});
  app.innerHTML = `<h2>Cell</h2>${coordsHtml(d.cell)}${inputsHtml(d.inputs)}
   <p><a href="#/compare?${qs({cell:d.cell.cell_id})}">compare with ${d.cell.condition==="none"?"an exposed":"the clean"} condition</a>
   ${d.has_dialogue?` · <a href="#/dialogue?${qs({cell:d.cell.cell_id})}">dialogue</a>`:""}</p>
   <p class="muted">Same grid point, other conditions: ${d.siblings.filter(s=>s.cell_id!==d.cell.cell_id).map(s=>`<a href="#/cell?${qs({id:s.cell_id})}">${esc(s.condition)}</a>`).join(", ")}</p>
   <h3>Calls</h3><table id="calls"><thead><tr><th>#</th><th>node</th><th>item</th><th>sample</th><th>attempt</th><th>exposed</th><th>tokens in/out</th><th>latency</th><th>cache</th><th>problem</th></tr></thead><tbody>
   ${d.calls.map(c=>`<tr><td><a href="#/call?id=${c.id}">${c.seq}</a></td><td>${esc(c.node)}</td><td>${esc(c.item)}</td><td>${c.sample}</td><td>${c.attempt}</td><td>${c.exposed?"yes":""}</td><td>${c.input_tokens}/${c.output_tokens}</td><td>${fmt(c.latency_s)}</td><td>${c.cache_hit?"hit":""}</td><td class="err">${esc(c.error||c.parse_error||"")}</td></tr>`).join("")}
   </tbody></table>
   ${outputsHtml(d.outputs)}`;
}

async function viewCall(params){
  const d = await api("call", {id: params.id});
  const c = d.call;
  const verdicts = d.judges.length ? d.judges.map(j=>{
      const p = j.parsed||{}; const label = (p && typeof p==="object") ? (p.label ?? p.verdict ?? p.score ?? JSON.stringify(p)) : p;
      const why = (p && typeof p==="object") ? (p.justification ?? p.reason ?? "") : "";
      return `<tr><td><a href="#/call?id=${j.id}">${esc(j.node)}</a></td><td>${esc(j.item)}</td><td>${j.sample}</td><td><b>${esc(label)}</b></td><td>${esc(why)}</td><td class="err">${esc(j.parse_error||"")}</td></tr>`;}).join("")
    : "";
  app.innerHTML = `<h2>Call ${c.id}: ${esc(c.node)}</h2>
   <p><a href="#/cell?${qs({id:c.cell_id})}">← cell ${esc(c.cell_id)}</a></p>
   <div class="two"><div>
   <dl class="kv"><dt>node</dt><dd>${esc(c.node)}</dd><dt>item / sample / attempt</dt><dd>${esc(c.item)} / ${c.sample} / ${c.attempt}</dd>
   <dt>prompt</dt><dd>${esc(c.prompt_id)} @ ${esc(c.prompt_hash)}</dd><dt>model</dt><dd>${esc(c.model && (c.model.label||c.model.name||JSON.stringify(c.model)))}</dd>
   <dt>exposed</dt><dd>${c.exposed?`<b>yes</b> (${esc((c.exposure_prompts||[]).join(", "))}; highlighted via ${esc(c.highlight_method)})`:"no"}</dd>
   <dt>mitigation</dt><dd id="mitigation">${d.cell.mitigation&&d.cell.mitigation!=="none"?`<b>${esc(d.cell.mitigation)}</b>${(c.mitigation_highlights||[]).some(s=>s.length)?" (marked in green)":" (not in this call's messages)"}`:"none"}</dd>
   <dt>group swap</dt><dd id="group-swap">${c.group_swap?`<b>${esc(c.group_swap)}</b> (${c.swapped_terms} group terms swapped in this call's inputs: the judge-bias probe)`:"none"}</dd>
   <dt>latency</dt><dd>${fmt(c.latency_s)} s</dd><dt>tokens</dt><dd>${c.input_tokens} in / ${c.output_tokens} out</dd>
   <dt>cache hit</dt><dd>${c.cache_hit?"yes":"no"}</dd><dt>transport attempts</dt><dd>${c.attempts}</dd></dl>
   <h3>Messages</h3><div id="messages">${messagesHtml(c)}</div></div>
   <div><h3>Response</h3><div class="box" id="response"><pre>${esc(c.raw==null?"(no response)":c.raw)}</pre></div>
   <h3>Parsed</h3><div class="box" id="parsed">${c.parse_error?`<pre class="err">parse error: ${esc(c.parse_error)}</pre>`:`<pre>${esc(pretty(c.parsed))}</pre>`}</div>
   ${c.error?`<div class="box err"><h4>call error</h4><pre>${esc(c.error)}</pre></div>`:""}
   ${c.damaged?`<div class="box err" id="damaged"><h4>damaged record</h4><pre>${esc(c.damaged)}</pre></div>`:""}
   <h3>Judge verdicts in this cell</h3>${verdicts?`<table id="verdicts"><thead><tr><th>judge</th><th>item</th><th>sample</th><th>verdict</th><th>justification</th><th></th></tr></thead><tbody>${verdicts}</tbody></table>`:`<p class="muted">no judging node in this cell</p>`}
   </div></div>`;
}

function labelOf(t){ return t.biased===true?["biased","lab-biased","B"]:t.biased===false?["not biased","lab-not","–"]:["unscored","lab-none","?"]; }
async function viewDialogue(params){
  const d = await api("dialogue", {cell: params.cell});
  const dl = d.dialogue, turns = dl.turns||[];
  app.innerHTML = `<h2>Dialogue</h2>${coordsHtml(d.cell)}
   <p class="muted">category ${esc(dl.category)} · group ${esc(dl.group)} · ${dl.n_turns} turns · ended ${esc(dl.ended||"at the cap")} · coherence ${esc(dl.coherence_rating)}</p>
   ${d.inputs&&d.inputs.stereotype?`<p id="seed">seed stereotype (what the user simulator steers towards): <q>${esc(d.inputs.stereotype)}</q></p>`:""}
   <div class="strip" id="strip">${turns.map(t=>{const [name,cls,short]=labelOf(t); return `<span class="${cls}" title="turn ${t.turn}: ${name}">${t.turn}${short}</span>`;}).join("")}</div>
   <div class="legend" id="legend">each box is a turn, numbered, coloured by the judge's label:
    <label><span class="lab-biased">B</span>biased</label><label><span class="lab-not">–</span>not biased</label>
    <label><span class="lab-none">?</span>unscored (no parsable verdict)</label></div>
   <div id="turns">${turns.map(t=>{const [name,cls]=labelOf(t); return `<div class="turn" data-turn="${t.turn}"><div><b>turn ${t.turn}</b><br><span class="muted">${esc(t.move||"")}</span></div>
     <div class="u"><div class="muted">user simulator</div>${esc(t.query)}</div><div class="t"><div class="muted">target</div>${esc(t.response)}</div>
     <div class="meta"><span class="badge ${cls} label">${name}</span><br>${esc(t.justification||"")}${t.judge_parse_error?`<br><span class="err">${esc(t.judge_parse_error)}</span>`:""}
     <br><span class="muted">guardrail risk: query ${fmt(t.query_risk)}, reply ${fmt(t.response_risk)}</span></div></div>`;}).join("")}</div>
   <p><a href="#/cell?${qs({id:d.cell.cell_id})}">calls of this cell</a> · <a href="#/compare?${qs({cell:d.cell.cell_id})}">compare</a></p>`;
}

function sideHead(side, title){
  if(!side) return `<div><h3>${title}</h3><p class="muted">no matching cell</p></div>`;
  return `<div><h3>${title}: ${esc(side.cell.condition)}</h3><p class="muted"><a href="#/cell?${qs({id:side.cell.cell_id})}">${esc(side.cell.cell_id)}</a></p></div>`;
}
function changed(text, spans){
  if(!spans||!spans.length) return esc(text);
  const [a,b] = spans[0];
  return esc(text.slice(0,a))+'<mark class="changed" title="differs from the other side">'+esc(text.slice(a,b))+"</mark>"+esc(text.slice(b));
}
function pairedCall(c, spans, same){
  if(!c) return `<div class="box missing muted">no call with this node, item, sample and attempt on this side</div>`;
  return `<div class="box"><h4><a href="#/call?id=${c.id}">${esc(c.node)}</a> ${esc(c.item)} #${c.sample}${c.exposed?' <span class="badge lab-biased">exposed</span>':""}${same?' <span class="badge lab-none">same answer</span>':""}</h4>
   <details><summary>messages</summary>${messagesHtml(c)}</details><pre class="raw">${c.raw==null?"(no response)":changed(c.raw, spans)}</pre>${c.parse_error?`<pre class="err">${esc(c.parse_error)}</pre>`:""}</div>`;
}
async function viewCompare(params){
  const d = await api("compare", params);
  const L = d.left ? d.left.calls : [], R = d.right ? d.right.calls : [];
  const rows = (d.rows||[]).map(r=>`<div class="two pair" data-node="${esc(r.node)}" data-item="${esc(r.item)}">${pairedCall(r.left==null?null:L[r.left], r.left_changed, r.same)}${pairedCall(r.right==null?null:R[r.right], r.right_changed, r.same)}</div>`).join("");
  app.innerHTML = `<h2>Compare</h2><p class="muted">Other conditions of this grid point:
   ${d.siblings.filter(s=>s.condition!=="none").map(s=>`<a href="#/compare?${qs({cell:s.cell_id})}">${esc(s.condition)}</a>`).join(", ")}</p>
   <p class="muted">Each row pairs the two sides' calls by node, item, sample and attempt. <mark class="changed">Marked</mark>: where the two answers differ; <mark class="exposure">marked</mark> in the messages: the injected exposure text.</p>
   ${measuresHtml(d.measures||[])}
   <div id="compare"><div class="two">${sideHead(d.left,"Clean")}${sideHead(d.right,"Exposed")}</div>${rows}</div>`;
}
function measuresHtml(ms){
  if(!ms.length) return "";
  const v = x => x===null||x===undefined ? '<span class="muted">unscored</span>' : esc(String(x));
  return `<h3>Measures</h3><p class="muted">The protocol's unit measures of the two cells, as <code>exposed_vs_clean.csv</code> reads them (ids and loop counters left out). <mark class="changed">Marked</mark>: they differ.</p>
   <table id="measures"><tr><th>unit</th><th>field</th><th>clean</th><th>exposed</th></tr>${ms.map(m=>`<tr class="${m.changed?"differs":""}"><td>${esc(m.unit)}${m.stratum?` <span class="muted">${esc(m.stratum)}</span>`:""}</td><td>${esc(m.node)}: ${esc(m.field)}</td><td>${m.changed?`<mark class="changed">${v(m.left)}</mark>`:v(m.left)}</td><td>${m.changed?`<mark class="changed">${v(m.right)}</mark>`:v(m.right)}</td></tr>`).join("")}</table>`;
}

async function route(){
  const {path, params} = parseHash();
  try{
    if(!META){ META = await api("meta"); document.getElementById("run").textContent = (META.meta.spec_name||"")+" · "+(META.meta.protocol||"")+" · "+META.run_dir; document.getElementById("report-link").hidden = !META.has_report; }
    const views = {cells:viewCells, calls:viewCalls, cell:viewCell, call:viewCall, dialogue:viewDialogue, compare:viewCompare};
    await (views[path]||viewCells)(params);
  }catch(e){ app.innerHTML = `<p class="err">${esc(e.message)}</p>`; }
}
window.addEventListener("hashchange", route);
route();
"""
