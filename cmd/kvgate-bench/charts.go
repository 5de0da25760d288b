package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeCharts draws the comparison's PNG charts into dir (the first seed's runs) and returns their file
// names: TTFT CDF per policy and load, hit rate vs oracle per policy and load, hit rate over time per
// load, running requests per endpoint over time per policy and load.
func writeCharts(dir string, rs []result, ts []timeSeries) ([]string, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	seed := rs[0].Seed
	var names []string
	save := func(p *plot.Plot, name string, w, h vg.Length) error {
		if err := p.Save(w, h, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		names = append(names, name)
		return nil
	}
	wl := rs[0].Workload
	loads := loadsOf(rs)
	policies := policiesOf(rs)
	series := func(policy string, load float64) *timeSeries {
		for i := range ts {
			if ts[i].Policy == policy && ts[i].Load == load && ts[i].Seed == seed {
				return &ts[i]
			}
		}
		return nil
	}
	for _, load := range loads {
		// TTFT CDF.
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: TTFT CDF at load %g×", wl, load)
		p.X.Label.Text, p.Y.Label.Text = "TTFT (s, log scale)", "fraction of requests"
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = false, false
		for i, pol := range policies {
			s := series(pol, load)
			if s == nil || len(s.TTFT) == 0 {
				continue
			}
			xy := make(plotter.XYs, len(s.TTFT))
			for j, v := range s.TTFT {
				xy[j] = plotter.XY{X: max(v, 1e-3), Y: float64(j+1) / float64(len(s.TTFT))}
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			styleLine(l, i)
			p.Add(l)
			p.Legend.Add(pol, l)
		}
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.XOffs = 0
		p.Legend.YOffs = vg.Points(10)
		if err := save(p, fmt.Sprintf("%s_ttft_cdf_load%s.png", wl, loadName(load)), 8*vg.Inch, 5*vg.Inch); err != nil {
			return nil, err
		}
		// Hit rate over time.
		p = plot.New()
		p.Title.Text = fmt.Sprintf("%s: hit rate over time at load %g× (requests by send time)", wl, load)
		p.X.Label.Text, p.Y.Label.Text = "time since run start (s)", "hit rate"
		p.Y.Min, p.Y.Max = 0, 1
		for i, pol := range policies {
			s := series(pol, load)
			if s == nil {
				continue
			}
			var xy plotter.XYs
			for j, v := range s.HitRate {
				if v >= 0 {
					xy = append(xy, plotter.XY{X: (float64(j) + 0.5) * s.WindowSeconds, Y: v})
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			styleLine(l, i)
			p.Add(l)
			p.Legend.Add(pol, l)
		}
		p.Legend.Top = true
		if err := save(p, fmt.Sprintf("%s_hit_over_time_load%s.png", wl, loadName(load)), 8*vg.Inch, 5*vg.Inch); err != nil {
			return nil, err
		}
		// Running per endpoint, per policy.
		for _, pol := range policies {
			s := series(pol, load)
			if s == nil || len(s.Running) == 0 {
				continue
			}
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s, %s, load %g×: running requests per endpoint", wl, pol, load)
			p.X.Label.Text, p.Y.Label.Text = "time since run start (s)", "running requests"
			var eps []string
			for e := range s.Running {
				eps = append(eps, e)
			}
			slices.SortFunc(eps, func(a, b string) int {
				if len(a) != len(b) {
					return len(a) - len(b)
				}
				return strings.Compare(a, b)
			})
			for i, e := range eps {
				xy := make(plotter.XYs, len(s.Running[e]))
				for j, v := range s.Running[e] {
					xy[j] = plotter.XY{X: float64(j+1) * s.SampleSeconds, Y: v}
				}
				if len(xy) == 0 {
					continue
				}
				l, err := plotter.NewLine(xy)
				if err != nil {
					return nil, err
				}
				styleLine(l, i)
				l.Dashes = nil
				p.Add(l)
				p.Legend.Add(e, l)
			}
			p.Legend.Top = true
			if err := save(p, fmt.Sprintf("%s_running_%s_load%s.png", wl, pol, loadName(load)), 8*vg.Inch, 4*vg.Inch); err != nil {
				return nil, err
			}
		}
	}
	// Hit rate vs oracle: bars per load, oracle as points.
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: hit rate (bars) vs oracle (circles) and LRU ceiling (triangles)", wl)
	p.Y.Label.Text = "hit rate"
	p.Y.Min, p.Y.Max = 0, 1
	width := vg.Points(60 / float64(max(len(loads), 1)))
	for li, load := range loads {
		vals := make(plotter.Values, len(policies))
		orc := make(plotter.XYs, len(policies))
		lru := make(plotter.XYs, len(policies))
		off := width * vg.Length(float64(li)-float64(len(loads)-1)/2)
		for i, pol := range policies {
			if r := pick(rs, pol, load, seed); r != nil {
				vals[i] = r.HitRate
				orc[i] = plotter.XY{X: float64(i), Y: r.OracleHitRate}
				lru[i] = plotter.XY{X: float64(i), Y: r.LRUHitRate}
			}
		}
		bc, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bc.Offset = off
		bc.Color = plotutil.Color(li)
		bc.LineStyle.Width = 0
		p.Add(bc)
		p.Legend.Add(fmt.Sprintf("load %g×", load), bc)
		for _, pts := range []struct {
			xy    plotter.XYs
			shape draw.GlyphDrawer
		}{{orc, draw.CircleGlyph{}}, {lru, draw.TriangleGlyph{}}} {
			sc, err := plotter.NewScatter(pts.xy)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle.Shape = pts.shape
			sc.GlyphStyle.Color = plotutil.Color(li)
			sc.GlyphStyle.Radius = vg.Points(3)
			p.Add(sc)
		}
	}
	p.NominalX(policies...)
	p.Legend.Top = true
	if err := save(p, fmt.Sprintf("%s_hit_vs_oracle.png", wl), 10*vg.Inch, 5*vg.Inch); err != nil {
		return nil, err
	}
	return names, nil
}

func loadName(l float64) string { return strings.ReplaceAll(fmt.Sprintf("%g", l), ".", "_") }

func styleLine(l *plotter.Line, i int) {
	l.LineStyle.Width = vg.Points(1.5)
	l.LineStyle.Color = plotutil.Color(i)
	l.LineStyle.Dashes = plotutil.Dashes(i / 7)
	if i == 0 {
		l.LineStyle.Width = vg.Points(2.5)
		l.LineStyle.Color = color.RGBA{R: 200, A: 255}
	}
}
