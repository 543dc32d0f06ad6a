package soakreport

import (
	"fmt"
	"math"
	"strings"
)

// A Point of a line; Break starts a new line at it (a restarted process is
// a new line, not a jump).
type Point struct {
	X, Y  float64
	Break bool
}

// A Series is one named line.
type Series struct {
	Name   string
	Points []Point
}

// A Band shades [From, To] on the X axis (a fault window), labelled.
type Band struct {
	From, To float64
	Label    string
}

// A Plot is a line chart on linear axes.
type Plot struct {
	Title, XLabel, YLabel string
	Series                []Series
	Bands                 []Band
	// Width and Height in pixels (default 1200 × 520).
	Width, Height int
	// XTick and YTick format tick labels (default %g).
	XTick, YTick func(float64) string
	// YFromZero starts the Y axis at 0.
	YFromZero bool
}

// Colors are the lines' colors, in order (the benchmark plots' palette);
// lines past the last color repeat them dashed.
var Colors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

const (
	plotLeft, plotRight, plotTop, plotBottom = 80, 320, 50, 60
)

// SVG draws the plot as a self-contained SVG document.
func (p Plot) SVG() string {
	w, h := p.Width, p.Height
	if w == 0 {
		w = 1200
	}
	if h == 0 {
		h = 520
	}
	plain := func(v float64) string { return fmt.Sprintf("%g", v) }
	xt, yt := p.XTick, p.YTick
	if xt == nil {
		xt = plain
	}
	if yt == nil {
		yt = plain
	}
	xlo, xhi, ylo, yhi := p.bounds()
	pw, ph := float64(w-plotLeft-plotRight), float64(h-plotTop-plotBottom)
	x := func(v float64) float64 { return plotLeft + pw*(v-xlo)/(xhi-xlo) }
	y := func(v float64) float64 { return plotTop + ph*(1-(v-ylo)/(yhi-ylo)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="25" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, esc(p.Title))
	for _, band := range p.Bands {
		x0, x1 := x(math.Max(band.From, xlo)), x(math.Min(band.To, xhi))
		if x1 < x0 {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%.0f" fill="#f4cccc" fill-opacity="0.6"/>`+"\n", x0, plotTop, math.Max(x1-x0, 1), ph)
		if band.Label != "" {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#a33" transform="rotate(90 %.1f %d)">%s</text>`+"\n", x0+2, plotTop+4, x0+2, plotTop+4, esc(band.Label))
		}
	}
	for _, v := range ticks(xlo, xhi, 10) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(v), plotTop, x(v), h-plotBottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(v), h-plotBottom+16, esc(xt(v)))
	}
	for _, v := range ticks(ylo, yhi, 8) {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", plotLeft, y(v), w-plotRight, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, y(v)+4, esc(yt(v)))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", plotLeft, plotTop, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", plotLeft+pw/2, h-15, esc(p.XLabel))
	fmt.Fprintf(&b, `<text x="18" y="%.1f" transform="rotate(-90 18 %.1f)" text-anchor="middle">%s</text>`+"\n", plotTop+ph/2, plotTop+ph/2, esc(p.YLabel))
	for i, s := range p.Series {
		color := Colors[i%len(Colors)]
		dash := ""
		if i >= len(Colors) {
			dash = ` stroke-dasharray="6 3"`
		}
		for _, seg := range segments(s.Points) {
			if len(seg) == 1 {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", x(seg[0].X), y(seg[0].Y), color)
				continue
			}
			pts := make([]string, len(seg))
			for j, pt := range seg {
				pts[j] = fmt.Sprintf("%.1f,%.1f", x(pt.X), y(pt.Y))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		}
		ly := plotTop + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>`+"\n", w-plotRight+15, ly, w-plotRight+35, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-plotRight+40, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// bounds are the axes' ranges: every finite point and band, padded so a
// flat line or a single point still has an axis.
func (p Plot) bounds() (xlo, xhi, ylo, yhi float64) {
	xlo, ylo = math.Inf(1), math.Inf(1)
	xhi, yhi = math.Inf(-1), math.Inf(-1)
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if !finite(pt.X) || !finite(pt.Y) {
				continue
			}
			xlo, xhi = math.Min(xlo, pt.X), math.Max(xhi, pt.X)
			ylo, yhi = math.Min(ylo, pt.Y), math.Max(yhi, pt.Y)
		}
	}
	for _, band := range p.Bands {
		if finite(band.From) && finite(band.To) {
			xlo, xhi = math.Min(xlo, band.From), math.Max(xhi, band.To)
		}
	}
	if math.IsInf(xlo, 1) {
		xlo, xhi = 0, 1
	}
	if math.IsInf(ylo, 1) {
		ylo, yhi = 0, 1
	}
	if p.YFromZero {
		ylo = math.Min(ylo, 0)
	}
	if xhi <= xlo {
		xhi = xlo + 1
	}
	if yhi <= ylo {
		yhi = ylo + math.Max(math.Abs(ylo), 1)
	}
	yhi += (yhi - ylo) * 0.05
	return xlo, xhi, ylo, yhi
}

// segments splits points at breaks and at points that cannot be drawn.
func segments(pts []Point) [][]Point {
	var out [][]Point
	var cur []Point
	for _, pt := range pts {
		if !finite(pt.X) || !finite(pt.Y) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		if pt.Break && len(cur) > 0 {
			out = append(out, cur)
			cur = nil
		}
		cur = append(cur, pt)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// ticks returns round values (1, 2 or 5 times a power of ten apart) in
// [lo, hi], at most about n of them.
func ticks(lo, hi float64, n int) []float64 {
	step := niceStep((hi - lo) / float64(n))
	// Round to the step's decimals, so 3 × 0.1 prints as 0.3.
	scale := math.Pow(10, math.Max(0, -math.Floor(math.Log10(step))))
	var out []float64
	for k := math.Ceil(lo/step - 1e-9); k*step <= hi+step*1e-9; k++ {
		v := math.Round(k*step*scale) / scale
		if v == 0 {
			v = 0 // not -0
		}
		out = append(out, v)
	}
	return out
}

// niceStep is the smallest of 1, 2, 5 × 10^k not below raw.
func niceStep(raw float64) float64 {
	if raw <= 0 || !finite(raw) {
		return 1
	}
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= raw*(1-1e-9) {
			return m * pow
		}
	}
	return 10 * pow
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

var escaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func esc(s string) string { return escaper.Replace(s) }
