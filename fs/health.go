package fs

// healthView renders a stack's health: one JSON observation a line, observed at each open (and
// each stat, so st_size is what a read returns). The mtime is the record's updatedAt all the same,
// so make and editors see the file change only when the stack does.
func (f *FS) healthView(cockpit, stack string) render {
	return func() (view, error) {
		obs, err := f.eng.Health(cockpit, stack)
		if err != nil {
			return view{}, err
		}
		data := make([]byte, 0, 4<<10) // six observations' lines
		for _, o := range obs {
			data = append(o.AppendJSON(data), '\n') // a remedy's "<" or ">" reads as written
		}
		v := view{data: data, uid: f.uid}
		// An unreadable record is reported in the content (claim-state failed); the file itself
		// still opens, owned by the daemon's user.
		if r, err := f.eng.Stack(cockpit, stack); err == nil {
			v.mtime, v.uid, v.revision = stamp(r.UpdatedAt), f.stackUID(r), r.Revision
		}
		return v, nil
	}
}
