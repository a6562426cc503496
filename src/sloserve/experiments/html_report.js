// report.html's plotter (inlined into the page by html_report.py): SVG axes with nice
// ticks, step lines, hover read-out, legend toggles. No dependencies, no network.
(function(){
const D = JSON.parse(document.getElementById('data').textContent);
const C = ['#0072B2','#E69F00','#009E73','#CC79A7','#56B4E9','#D55E00','#F0E442','#000000'];
const DASH = ['', '6 3', '2 2', '8 3 2 3'];
const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent){const e=document.createElementNS(NS,tag);
  for(const k in attrs) e.setAttribute(k, attrs[k]); if(parent) parent.appendChild(e); return e;}
function ticks(lo, hi, n){ if(!(hi>lo)){hi=lo+1;} const raw=(hi-lo)/n, p=Math.pow(10,Math.floor(Math.log10(raw)));
  const step=[1,2,5,10].map(m=>m*p).find(s=>s>=raw); const out=[];
  for(let v=Math.ceil(lo/step)*step; v<=hi+1e-9*step; v+=step) out.push(+v.toPrecision(12)); return out;}
function fmt(v){return Math.abs(v)>=1000?v.toFixed(0):String(+v.toPrecision(4));}
let drawn = 0;
function plot(host, title, xl, yl, series){
  const W=520,H=300,L=52,R=26,T=24,B=40; const box=document.createElement('div'); box.className='plot';
  host.appendChild(box); const svg=el('svg',{width:W,height:H,viewBox:`0 0 ${W} ${H}`},box);
  el('text',{x:L,y:15,'font-weight':'600'},svg).textContent=title;
  const all=series.filter(s=>s.x.length); let x0=Infinity,x1=-Infinity,y0=0,y1=-Infinity;
  for(const s of all){for(const v of s.x){x0=Math.min(x0,v);x1=Math.max(x1,v);} for(const v of s.y){y1=Math.max(y1,v);y0=Math.min(y0,v);}}
  if(!all.length){x0=0;x1=1;y1=1;} if(x1<=x0) x1=x0+1; if(y1<=y0) y1=y0+1;
  const sx=v=>L+(v-x0)/(x1-x0)*(W-L-R), sy=v=>H-B-(v-y0)/(y1-y0)*(H-T-B);
  for(const t of ticks(x0,x1,6)){el('line',{x1:sx(t),x2:sx(t),y1:T,y2:H-B,class:'grid'},svg);
    el('text',{x:sx(t),y:H-B+14,'text-anchor':'middle'},svg).textContent=fmt(t);}
  for(const t of ticks(y0,y1,5)){el('line',{x1:L,x2:W-R,y1:sy(t),y2:sy(t),class:'grid'},svg);
    el('text',{x:L-4,y:sy(t)+4,'text-anchor':'end'},svg).textContent=fmt(t);}
  el('line',{x1:L,x2:W-R,y1:H-B,y2:H-B,class:'axis'},svg); el('line',{x1:L,x2:L,y1:T,y2:H-B,class:'axis'},svg);
  el('text',{x:(L+W-R)/2,y:H-6,'text-anchor':'middle'},svg).textContent=xl;
  el('text',{x:12,y:(T+H-B)/2,'text-anchor':'middle',transform:`rotate(-90 12 ${(T+H-B)/2})`},svg).textContent=yl;
  const paths=[]; const legend=document.createElement('div'); legend.className='legend'; box.appendChild(legend);
  series.forEach((s,i)=>{ const col=C[i%C.length], dash=DASH[Math.floor(i/C.length)%DASH.length];
    let d=''; for(let k=0;k<s.x.length;k++){ const X=sx(s.x[k]).toFixed(1), Y=sy(s.y[k]).toFixed(1);
      if(k===0) d+=`M${X},${Y}`; else d+=`H${X}V${Y}`; }
    const p=el('path',{d:d||'M0,0',fill:'none',stroke:col,'stroke-width':1.6,'stroke-dasharray':dash,class:'series','data-name':s.name},svg);
    paths.push(p); const item=document.createElement('span'); item.style.color=col;
    item.textContent=(dash?'┅ ':'━ ')+s.name+(s.x.length?'':' (no data)'); legend.appendChild(item);
    item.addEventListener('click',()=>{const off=item.classList.toggle('off'); p.style.display=off?'none':'';});});
  const tip=document.createElement('div'); tip.className='tip'; box.appendChild(tip);
  const dot=el('circle',{r:3.5,fill:'none',stroke:'#000',visibility:'hidden'},svg);
  svg.addEventListener('mousemove',ev=>{ const r=svg.getBoundingClientRect(); const mx=ev.clientX-r.left, my=ev.clientY-r.top;
    const xv=x0+(mx-L)/(W-L-R)*(x1-x0); let best=null;
    series.forEach((s,i)=>{ if(!s.x.length||paths[i].style.display==='none') return;
      let lo=0,hi=s.x.length-1; while(lo<hi){const m=(lo+hi+1)>>1; if(s.x[m]<=xv) lo=m; else hi=m-1;}
      const dist=Math.abs(sy(s.y[lo])-my); if(!best||dist<best.d) best={d:dist,s,k:lo}; });
    if(!best){tip.style.display='none'; dot.setAttribute('visibility','hidden'); return;}
    const s=best.s,k=best.k; dot.setAttribute('cx',sx(s.x[k])); dot.setAttribute('cy',sy(s.y[k])); dot.setAttribute('visibility','visible');
    tip.textContent=`${s.name}: ${xl} ${fmt(s.x[k])}, ${yl} ${fmt(s.y[k])}`; tip.style.display='block';
    tip.style.left=(mx+12)+'px'; tip.style.top=(my+8)+'px';});
  svg.addEventListener('mouseleave',()=>{tip.style.display='none'; dot.setAttribute('visibility','hidden');});
  drawn++;
}
const cdf=document.getElementById('cdfs');
plot(cdf,'TTFT','TTFT (s)','fraction of requests',D.cdfs.ttft);
plot(cdf,'TPOT','TPOT (ms)','fraction of requests',D.cdfs.tpot);
plot(cdf,'End-to-end latency','E2E (s)','fraction of requests',D.cdfs.e2e);
const tl=document.getElementById('timeline');
plot(tl,'Running requests','time (s)','running',D.timeline.running);
plot(tl,'Waiting requests','time (s)','waiting',D.timeline.waiting);
plot(tl,'KV cache usage','time (s)','KV usage (%)',D.timeline.kv);
if((D.timeline.prefix_hit||[]).length) plot(tl,'Prefix-cache hit rate','time (s)','hit rate (%)',D.timeline.prefix_hit);
document.body.setAttribute('data-plots', String(drawn));
})();
