package chattemplate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// maxRange is Jinja2's sandbox MAX_RANGE: range() with more items raises OverflowError.
const maxRange = 100000

// sandboxRange mirrors jinja2.sandbox.safe_range: Python's range over integers, refused beyond maxRange
// items (ardanlabs/jinja's own range would allocate any size).
func sandboxRange(args []jinja.Value) (jinja.Value, error) {
	ints := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			ints[i] = a.AsInt()
		case a.IsBool():
			if a.AsBool() {
				ints[i] = 1
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range(): %s object cannot be interpreted as an integer", typeName(a))
		}
	}
	var start, stop, step int64 = 0, 0, 1
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range expected 1 to 3 arguments, got %d", len(ints))
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range() arg 3 must not be zero")
	}
	// Length without overflow: ceil((stop-start)/step) when positive.
	var n uint64
	if step > 0 && stop > start {
		n = (uint64(stop-start) + uint64(step) - 1) / uint64(step)
	} else if step < 0 && start > stop {
		n = (uint64(start-stop) + uint64(-step) - 1) / uint64(-step)
	}
	if n > maxRange {
		return jinja.Undefined(), fmt.Errorf("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", maxRange)
	}
	items := make([]jinja.Value, n)
	v := start
	for i := range items {
		items[i] = jinja.NewInt(v)
		v += step
	}
	return jinja.NewList(items), nil
}

func typeName(v jinja.Value) string {
	switch {
	case v.IsFloat():
		return "'float'"
	case v.IsString():
		return "'str'"
	case v.IsNone():
		return "'NoneType'"
	case v.IsList():
		return "'list'"
	case v.IsDict():
		return "'dict'"
	}
	return "this"
}

var (
	shortDays   = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}
	longDays    = []string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	shortMonths = []string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}
	longMonths  = []string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// strftime formats t like Python's datetime.strftime on Linux (glibc, C locale), which is what
// transformers' strftime_now calls. Supported: %a %A %b %h %B %c %C %d %D %e %F %H %I %j %k %l %m %M %n
// %p %r %R %S %t %T %u %U %w %W %x %X %y %Y %z %Z %% and glibc's "-" flag (no padding, e.g. %-d). Any other
// directive is copied through unchanged, as glibc does.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		start := i
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		num := func(v, width int) {
			s := strconv.Itoa(v)
			if !noPad {
				for len(s) < width {
					s = "0" + s
				}
			}
			b.WriteString(s)
		}
		spaced := func(v int) {
			s := strconv.Itoa(v)
			if !noPad && len(s) < 2 {
				s = " " + s
			}
			b.WriteString(s)
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case 'a':
			b.WriteString(shortDays[t.Weekday()])
		case 'A':
			b.WriteString(longDays[t.Weekday()])
		case 'b', 'h':
			b.WriteString(shortMonths[t.Month()-1])
		case 'B':
			b.WriteString(longMonths[t.Month()-1])
		case 'c':
			b.WriteString(strftime(t, "%a %b %e %H:%M:%S %Y"))
		case 'C':
			num(t.Year()/100, 2)
		case 'd':
			num(t.Day(), 2)
		case 'D', 'x':
			b.WriteString(strftime(t, "%m/%d/%y"))
		case 'e':
			spaced(t.Day())
		case 'F':
			b.WriteString(strftime(t, "%Y-%m-%d"))
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num(hour12, 2)
		case 'j':
			num(t.YearDay(), 3)
		case 'k':
			spaced(t.Hour())
		case 'l':
			spaced(hour12)
		case 'm':
			num(int(t.Month()), 2)
		case 'M':
			num(t.Minute(), 2)
		case 'n':
			b.WriteByte('\n')
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'r':
			b.WriteString(strftime(t, "%I:%M:%S %p"))
		case 'R':
			b.WriteString(strftime(t, "%H:%M"))
		case 'S':
			num(t.Second(), 2)
		case 't':
			b.WriteByte('\t')
		case 'T', 'X':
			b.WriteString(strftime(t, "%H:%M:%S"))
		case 'U':
			num((t.YearDay()-1+7-int(t.Weekday()))/7, 2)
		case 'W':
			num((t.YearDay()-1+7-(int(t.Weekday())+6)%7)/7, 2)
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			num(wd, 1)
		case 'w':
			num(int(t.Weekday()), 1)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			num(t.Year(), 1)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteString(format[start : i+1])
		}
	}
	return b.String()
}
